// Tokenizer loading (GGUF and tokenizer.json), encoding and decoding. Loading builds one common
// representation: token strings, attributes, merges keyed by id pair, the added tokens to match in
// text; Finish() checks what every load must satisfy. BPE merges a word with a heap: O(n log n).
#include "lib/util/str_format.h"
#include "lib/text/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <queue>

#include "lib/format/file.h"
#include "lib/format/json.h"
#include "lib/text/unicode.h"
#include "nlohmann/json.hpp"

namespace strata::text {
namespace {

constexpr size_t kMaxCachedWord = 256;
constexpr size_t kMaxCacheEntries = 1 << 16;
const char kSpm[] = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// GPT-2's byte <-> printable code point map.
struct ByteMap {
  uint32_t to_cp[256];
  int16_t to_byte[512];
  ByteMap() {
    std::fill(std::begin(to_byte), std::end(to_byte), int16_t{-1});
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + n++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap &Bytes() {
  static const ByteMap m;
  return m;
}

std::string ByteLevelEncode(std::string_view raw) {
  std::string s;
  for (unsigned char b : raw) AppendUtf8(Bytes().to_cp[b], &s);
  return s;
}

// Vocabulary form -> raw bytes for byte-level tokens; code points outside the map stay as UTF-8.
std::string ByteLevelDecode(std::string_view tok) {
  std::string out;
  for (size_t i = 0; i < tok.size();) {
    size_t len;
    uint32_t cp = DecodeUtf8(tok, i, &len);
    if (cp < 512 && Bytes().to_byte[cp] >= 0 && !(cp == 0xFFFD && len == 1))
      out.push_back(static_cast<char>(Bytes().to_byte[cp]));
    else
      out.append(tok.substr(i, len));
    i += len;
  }
  return out;
}

// "<0xAB>" -> 0xAB, else -1.
int ParseByteToken(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    char c = t[k];
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, from.size()) == from) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

absl::Status Meta(const std::string &msg) { return MakeError(MOE_ERR_FORMAT_METADATA, msg); }

// Regexes of the pre-tokenizers as written in tokenizer.json files.
const char kReGpt2[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char kReLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kReQwen2[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kReO200k[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kReDsv3Digits[] = R"(\p{N}{1,3})";
const char kReDsv3Cjk[] = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
const char kReDsv3Words[] =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

struct Tokenizer::Sym {
  int32_t id;
  int32_t prev, next;
  bool mergeable;
};

TokenAttr Tokenizer::attr(int32_t id) const {
  return id >= 0 && id < vocab_size() ? attrs_[id] : TokenAttr::kUndefined;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  TokenAttr a = attr(id);
  return a == TokenAttr::kControl || a == TokenAttr::kUnknown;
}

const std::string &Tokenizer::token_text(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < vocab_size() ? tokens_[id] : kEmpty;
}

std::string Tokenizer::TokenToPiece(int32_t id) const {
  return id >= 0 && id < vocab_size() ? pieces_[id] : std::string();
}

// Checks shared by both loaders and derives pieces, byte ids and the added-token index.
absl::Status Tokenizer::Finish(const char *where) {
  const size_t n = tokens_.size();
  if (n == 0) return Meta(absl::StrCat(where, ": the vocabulary is empty"));
  if (n > (1u << 31) - 1) return Meta(absl::StrCat(where, ": too many tokens"));
  token_to_id_.clear();
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  pieces_.assign(n, std::string());
  for (auto &v : added_by_byte_) v.clear();
  for (size_t i = 0; i < n; ++i) {
    const std::string &t = tokens_[i];
    TokenAttr a = attrs_[i];
    if (a == TokenAttr::kControl || a == TokenAttr::kUserDefined || a == TokenAttr::kUnknown) {
      pieces_[i] = t;  // added tokens are stored as their text, in both formats
      if (!t.empty()) added_by_byte_[static_cast<unsigned char>(t[0])].push_back(static_cast<int32_t>(i));
      continue;
    }
    if (model_ == TokenizerModel::kByteLevelBpe) {
      pieces_[i] = ByteLevelDecode(t);
    } else {
      int b = byte_fallback_ ? ParseByteToken(t) : -1;
      if (b >= 0 && (a == TokenAttr::kByte || a == TokenAttr::kNormal)) {
        pieces_[i] = std::string(1, static_cast<char>(b));
        if (byte_ids_[b] < 0) byte_ids_[b] = static_cast<int32_t>(i);
        attrs_[i] = TokenAttr::kByte;
      } else {
        pieces_[i] = ReplaceAll(t, kSpm, " ");
      }
    }
  }
  if (model_ == TokenizerModel::kByteLevelBpe) {
    for (int b = 0; b < 256; ++b) {
      std::string c;
      AppendUtf8(Bytes().to_cp[b], &c);
      auto it = token_to_id_.find(c);
      if (it != token_to_id_.end()) byte_ids_[b] = it->second;
    }
  }
  for (auto &v : added_by_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Encoding.

bool Tokenizer::PairRank(int32_t a, int32_t b, double *prio, int32_t *merged) const {
  if (merge_by_score_) {
    auto it = token_to_id_.find(tokens_[a] + tokens_[b]);
    if (it == token_to_id_.end()) return false;
    // SentencePiece never produces control, unknown or byte pieces from text.
    TokenAttr t = attrs_[it->second];
    if (t == TokenAttr::kControl || t == TokenAttr::kUnknown || t == TokenAttr::kByte ||
        t == TokenAttr::kUnused)
      return false;
    *prio = -static_cast<double>(scores_[it->second]);
    *merged = it->second;
    return true;
  }
  auto it = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
  if (it == merges_.end()) return false;
  *prio = it->second.first;
  *merged = it->second.second;
  return true;
}

// Merges adjacent symbols, best pair (lowest rank / highest score) first, leftmost on ties.
void Tokenizer::MergeSymbols(std::vector<Sym> *syms_ptr) const {
  std::vector<Sym> &syms = *syms_ptr;
  struct Cand {
    double prio;
    int32_t left, left_id, right_id, merged;
    bool operator>(const Cand &o) const { return prio != o.prio ? prio > o.prio : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t l) {
    if (l < 0) return;
    int32_t r = syms[l].next;
    if (r < 0 || !syms[l].mergeable || !syms[r].mergeable) return;
    Cand c{0, l, syms[l].id, syms[r].id, -1};
    if (PairRank(c.left_id, c.right_id, &c.prio, &c.merged)) heap.push(c);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym &l = syms[c.left];
    if (l.id != c.left_id || l.next < 0 || syms[l.next].id != c.right_id || l.id < 0) continue;
    int32_t r = l.next;
    l.id = c.merged;
    l.next = syms[r].next;
    if (l.next >= 0) syms[l.next].prev = c.left;
    syms[r].id = -1;
    syms[r].prev = syms[r].next = -1;
    push(l.prev);
    push(c.left);
  }
}

// BPE of one pre-tokenized word (raw bytes), appending ids.
void Tokenizer::BpeWord(std::string_view word, std::vector<int32_t> *out) const {
  std::vector<Sym> syms;
  auto add = [&](int32_t id, bool mergeable) {
    int32_t k = static_cast<int32_t>(syms.size());
    syms.push_back(Sym{id, k - 1, -1, mergeable});
    if (k > 0) syms[k - 1].next = k;
  };
  if (model_ == TokenizerModel::kByteLevelBpe) {
    if (ignore_merges_) {
      auto it = token_to_id_.find(ByteLevelEncode(word));
      if (it != token_to_id_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    for (unsigned char b : word) {
      if (byte_ids_[b] >= 0) add(byte_ids_[b], true);
      else if (unk_ >= 0) add(unk_, false);
    }
  } else {
    bool last_unk = false;
    for (size_t i = 0; i < word.size();) {
      size_t len;
      DecodeUtf8(word, i, &len);
      std::string_view ch = word.substr(i, len);
      i += len;
      auto it = token_to_id_.find(std::string(ch));
      if (it != token_to_id_.end() && attrs_[it->second] != TokenAttr::kControl &&
          attrs_[it->second] != TokenAttr::kUnknown) {
        add(it->second, true);
        last_unk = false;
        continue;
      }
      bool all = byte_fallback_;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) add(byte_ids_[b], false);
        last_unk = false;
      } else if (unk_ >= 0) {
        if (!(fuse_unk_ && last_unk)) add(unk_, false);
        last_unk = true;
      }
    }
  }
  MergeSymbols(&syms);
  for (const Sym &s : syms)
    if (s.id >= 0) out->push_back(s.id);
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t> *out) const {
  if (word.size() > kMaxCachedWord) {
    BpeWord(word, out);
    return;
  }
  std::string key(word);
  {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  BpeWord(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  absl::MutexLock lock(&cache_mu_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::move(ids));
}

// A run of text between added tokens; `at_start`: it begins the whole input.
void Tokenizer::EncodeText(std::string_view text, bool at_start, std::vector<int32_t> *out) const {
  if (text.empty()) return;
  if (model_ == TokenizerModel::kSentencePieceBpe) {
    std::string norm;
    if (add_space_prefix_ && (at_start || !space_prefix_first_only_)) norm = kSpm;
    norm += ReplaceAll(text, " ", kSpm);
    BpeWord(norm, out);  // the whole segment is one word: not cached
    return;
  }
  for (auto [b, e] : PreTokenize(pre_, text)) EncodeWord(text.substr(b, e - b), out);
}

template <typename SpecialAt>
std::vector<int32_t> Tokenizer::EncodeImpl(std::string_view text, SpecialAt special_at) const {
  std::vector<int32_t> out;
  size_t seg = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t id : added_by_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string &t = tokens_[id];
      if (IsSpecial(id) && !special_at(i, t.size())) continue;
      if (text.compare(i, t.size(), t) == 0) {
        hit = id;
        break;  // longest first
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    EncodeText(text.substr(seg, i - seg), seg == 0, &out);
    out.push_back(hit);
    i += tokens_[hit].size();
    seg = i;
  }
  EncodeText(text.substr(seg), seg == 0, &out);
  return out;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  return EncodeImpl(text, [parse_special](size_t, size_t) { return parse_special; });
}

std::vector<int32_t> Tokenizer::EncodeSpecialWithin(std::string_view text,
                                                    absl::Span<const TextRange> special_ranges) const {
  // Matches are tried at increasing positions, so one cursor walks the ranges.
  size_t r = 0;
  return EncodeImpl(text, [&](size_t at, size_t n) {
    while (r < special_ranges.size() && special_ranges[r].end <= at) ++r;
    return r < special_ranges.size() && special_ranges[r].begin <= at && at + n <= special_ranges[r].end;
  });
}

// ---------------------------------------------------------------------------------------------
// Decoding.

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary [0, %d)", id,
                    vocab_size());
    out += pieces_[id];
  }
  if (strips_leading_space() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

namespace {

// Length of the UTF-8 sequence starting at s[0] when it is valid and complete (> 0); 0 when it is
// a valid but unfinished prefix running to the end of s; -1 when it is invalid.
int Utf8Status(std::string_view s) {
  auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = u(0);
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
  else return -1;
  for (int k = 1; k < n; ++k) {
    if (static_cast<size_t>(k) >= s.size()) return 0;
    unsigned char b = u(k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -1;
  }
  return n;
}

}  // namespace

std::string StreamDetokenizer::Push(int32_t id) {
  std::string piece = tok_.TokenToPiece(id);
  if (at_start_ && !piece.empty()) {
    if (tok_.strips_leading_space() && piece[0] == ' ') piece.erase(0, 1);
    at_start_ = false;
  }
  pending_ += piece;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    int st = Utf8Status(std::string_view(pending_).substr(i));
    if (st == 0) break;  // wait for the rest of the character
    if (st < 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(pending_, i, static_cast<size_t>(st));
      i += static_cast<size_t>(st);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDetokenizer::Finish() {
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  at_start_ = true;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Loading from GGUF.

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const format::GgufFile &gguf) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  const format::GgufValue *model = gguf.Find("tokenizer.ggml.model");
  if (model == nullptr) return Meta("tokenizer.ggml.model: missing");
  if (model->type != format::GgufType::kString) return Meta("tokenizer.ggml.model: not a string");
  if (model->s == "gpt2") {
    t->model_ = TokenizerModel::kByteLevelBpe;
  } else if (model->s == "llama") {
    t->model_ = TokenizerModel::kSentencePieceBpe;
    t->pre_ = PreTokenizer::kNone;
    t->merge_by_score_ = true;
    t->byte_fallback_ = true;
  } else {
    return Errorf(MOE_ERR_UNSUPPORTED, "tokenizer.ggml.model: '%s' is not supported (gpt2, llama)",
                  model->s);
  }

  const format::GgufValue *toks = gguf.Find("tokenizer.ggml.tokens");
  if (toks == nullptr) return Meta("tokenizer.ggml.tokens: missing");
  if (toks->type != format::GgufType::kArray || toks->elem_type != format::GgufType::kString)
    return Meta("tokenizer.ggml.tokens: not an array of strings");
  t->tokens_ = toks->arr_str;
  const size_t n = t->tokens_.size();
  if (n == 0) return Meta("tokenizer.ggml.tokens: empty");

  t->attrs_.assign(n, TokenAttr::kNormal);
  if (const format::GgufValue *types = gguf.Find("tokenizer.ggml.token_type")) {
    if (!types->IsIntArray()) return Meta("tokenizer.ggml.token_type: not an array of integers");
    if (types->arr_len != n)
      return Meta(strata::StrFormat("tokenizer.ggml.token_type: %d entries, tokenizer.ggml.tokens has %d",
                                  types->arr_len, n));
    for (size_t i = 0; i < n; ++i) {
      int64_t v = types->IntAt(i);
      if (v < 0 || v > 6)
        return Meta(strata::StrFormat("tokenizer.ggml.token_type[%d]: %d is not a token type", i, v));
      t->attrs_[i] = static_cast<TokenAttr>(v);
    }
  }

  if (t->model_ == TokenizerModel::kSentencePieceBpe) {
    const format::GgufValue *scores = gguf.Find("tokenizer.ggml.scores");
    if (scores == nullptr) return Meta("tokenizer.ggml.scores: missing (needed by the llama model)");
    if (!scores->IsFloatArray()) return Meta("tokenizer.ggml.scores: not an array of numbers");
    if (scores->arr_len != n)
      return Meta(strata::StrFormat("tokenizer.ggml.scores: %d entries, tokenizer.ggml.tokens has %d",
                                  scores->arr_len, n));
    t->scores_.resize(n);
    for (size_t i = 0; i < n; ++i) t->scores_[i] = static_cast<float>(scores->FloatAt(i));
    if (const format::GgufValue *v = gguf.Find("tokenizer.ggml.add_space_prefix")) {
      if (v->type != format::GgufType::kBool) return Meta("tokenizer.ggml.add_space_prefix: not a bool");
      t->add_space_prefix_ = v->u != 0;
    }
  } else {
    std::string pre = "default";
    if (const format::GgufValue *p = gguf.Find("tokenizer.ggml.pre")) {
      if (p->type != format::GgufType::kString) return Meta("tokenizer.ggml.pre: not a string");
      pre = p->s;
    }
    if (pre == "default" || pre == "gpt-2" || pre == "gpt2") t->pre_ = PreTokenizer::kGpt2;
    else if (pre == "llama-bpe" || pre == "llama3") { t->pre_ = PreTokenizer::kLlama3; t->ignore_merges_ = true; }
    else if (pre == "qwen2") t->pre_ = PreTokenizer::kQwen2;
    else if (pre == "deepseek-v3") t->pre_ = PreTokenizer::kDeepseekV3;
    else if (pre == "gpt-4o") t->pre_ = PreTokenizer::kO200k;
    else
      return Errorf(MOE_ERR_UNSUPPORTED,
                    "tokenizer.ggml.pre: '%s' is not supported (gpt-2, llama-bpe, qwen2, deepseek-v3, gpt-4o)", pre);
  }

  STRATA_RETURN_IF_ERROR(t->Finish("tokenizer.ggml.tokens"));

  // gpt2 needs merges; llama uses them when present (files converted from tokenizer.json), which
  // reproduces Hugging Face's rank order exactly; without them it merges by score.
  const format::GgufValue *merges = gguf.Find("tokenizer.ggml.merges");
  if (merges == nullptr && t->model_ == TokenizerModel::kByteLevelBpe)
    return Meta("tokenizer.ggml.merges: missing (needed by the gpt2 model)");
  if (merges != nullptr) {
    t->merge_by_score_ = false;
    if (merges->type != format::GgufType::kArray || merges->elem_type != format::GgufType::kString)
      return Meta("tokenizer.ggml.merges: not an array of strings");
    for (size_t r = 0; r < merges->arr_str.size(); ++r) {
      const std::string &m = merges->arr_str[r];
      size_t sp = m.find(' ', 1);  // a piece may itself be a space-free "Ġ": split at the first space after byte 0
      if (sp == std::string::npos)
        return Meta(strata::StrFormat("tokenizer.ggml.merges[%d]: '%s' is not 'left right'", r, m));
      std::string a = m.substr(0, sp), b = m.substr(sp + 1);
      auto ia = t->token_to_id_.find(a), ib = t->token_to_id_.find(b), ic = t->token_to_id_.find(a + b);
      const std::string *bad = ia == t->token_to_id_.end() ? &a : ib == t->token_to_id_.end() ? &b : nullptr;
      if (bad != nullptr)
        return Meta(strata::StrFormat("tokenizer.ggml.merges[%d]: '%s' names unknown token '%s'", r, m, *bad));
      if (ic == t->token_to_id_.end())
        return Meta(strata::StrFormat("tokenizer.ggml.merges[%d]: '%s' makes '%s', not in the vocabulary",
                                    r, m, a + b));
      uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                     static_cast<uint32_t>(ib->second);
      t->merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), ic->second));
    }
  }

  for (size_t i = 0; i < n; ++i)
    if (t->attrs_[i] == TokenAttr::kUnknown && t->unk_ < 0) t->unk_ = static_cast<int32_t>(i);
  auto id_key = [&](const char *key, int32_t *dst) -> absl::Status {
    const format::GgufValue *v = gguf.Find(key);
    if (v == nullptr) return absl::OkStatus();
    absl::StatusOr<uint64_t> u = gguf.GetUint(key);
    if (!u.ok() || *u >= n)
      return Meta(strata::StrFormat("%s: not a token id in [0, %d)", key, n));
    *dst = static_cast<int32_t>(*u);
    return absl::OkStatus();
  };
  if (t->model_ == TokenizerModel::kSentencePieceBpe) {
    // SentencePiece's defaults when the file does not say.
    if (n > 1) t->bos_ = 1;
    if (n > 2) t->eos_ = 2;
    t->add_bos_ = true;
  }
  STRATA_RETURN_IF_ERROR(id_key("tokenizer.ggml.bos_token_id", &t->bos_));
  STRATA_RETURN_IF_ERROR(id_key("tokenizer.ggml.eos_token_id", &t->eos_));
  STRATA_RETURN_IF_ERROR(id_key("tokenizer.ggml.unknown_token_id", &t->unk_));
  if (const format::GgufValue *v = gguf.Find("tokenizer.ggml.add_bos_token")) {
    if (v->type != format::GgufType::kBool) return Meta("tokenizer.ggml.add_bos_token: not a bool");
    t->add_bos_ = v->u != 0;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Loading from tokenizer.json.

namespace {

using Json = nlohmann::json;

// Walks pre_tokenizer / normalizer trees into what Strata implements.
struct HfPipeline {
  bool byte_level = false;
  std::vector<std::string> regexes;
  bool spm_prepend = false, spm_first_only = false, spm_replace = false, metaspace = false;
};

absl::Status Unsupported(const std::string &what) {
  return MakeError(MOE_ERR_UNSUPPORTED, what);
}

absl::Status WalkPre(const Json &p, HfPipeline *hp) {
  if (p.is_null()) return absl::OkStatus();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return Meta("tokenizer.json: pre_tokenizer: not an object with a type");
  std::string type = p["type"];
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      return Meta("tokenizer.json: pre_tokenizer.pretokenizers: not an array");
    for (const Json &q : p["pretokenizers"]) STRATA_RETURN_IF_ERROR(WalkPre(q, hp));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false))
      return Unsupported("tokenizer.json: pre_tokenizer ByteLevel with add_prefix_space is not supported");
    hp->byte_level = true;
    if (p.value("use_regex", true)) hp->regexes.push_back(kReGpt2);
    return absl::OkStatus();
  }
  if (type == "Split") {
    const Json &pat = p.value("pattern", Json());
    if (!pat.is_object() || !pat.contains("Regex") || !pat["Regex"].is_string())
      return Unsupported("tokenizer.json: pre_tokenizer Split: only Regex patterns are supported");
    if (p.value("behavior", std::string()) != "Isolated" || p.value("invert", false))
      return Unsupported("tokenizer.json: pre_tokenizer Split: only behavior Isolated, invert false");
    hp->regexes.push_back(pat["Regex"].get<std::string>());
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    if (p.value("replacement", std::string(kSpm)) != kSpm || p.value("split", true))
      return Unsupported("tokenizer.json: pre_tokenizer Metaspace: only replacement U+2581 with split false");
    std::string scheme = p.value("prepend_scheme", std::string("always"));
    hp->metaspace = true;
    hp->spm_replace = true;
    hp->spm_prepend = scheme != "never";
    hp->spm_first_only = scheme == "first";
    return absl::OkStatus();
  }
  return Unsupported(absl::StrCat("tokenizer.json: pre_tokenizer type '", type, "' is not supported"));
}

absl::Status WalkNormalizer(const Json &p, HfPipeline *hp) {
  if (p.is_null()) return absl::OkStatus();
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
    return Meta("tokenizer.json: normalizer: not an object with a type");
  std::string type = p["type"];
  if (type == "Sequence") {
    if (!p.contains("normalizers") || !p["normalizers"].is_array())
      return Meta("tokenizer.json: normalizer.normalizers: not an array");
    for (const Json &q : p["normalizers"]) STRATA_RETURN_IF_ERROR(WalkNormalizer(q, hp));
    return absl::OkStatus();
  }
  if (type == "NFC") return absl::OkStatus();  // assumed: input text is already NFC
  if (type == "Prepend" && p.value("prepend", std::string()) == kSpm) {
    hp->spm_prepend = true;
    return absl::OkStatus();
  }
  if (type == "Replace" && p.contains("pattern") && p["pattern"].is_object() &&
      p["pattern"].value("String", std::string()) == " " && p.value("content", std::string()) == kSpm) {
    hp->spm_replace = true;
    return absl::OkStatus();
  }
  return Unsupported(absl::StrCat("tokenizer.json: normalizer '", format::JsonExcerpt(p),
                                  "' is not supported"));
}

// bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}.
std::string ConfigToken(const Json &cfg, const char *key) {
  if (!cfg.is_object() || !cfg.contains(key)) return "";
  const Json &v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfFile(const std::string &path) {
  STRATA_ASSIGN_OR_RETURN(std::string json, format::ReadSmallFile(path, kHfTokenizerMaxBytes));
  return FromHfFile(path, json);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfFile(const std::string &path, std::string_view json) {
  std::string config;
  size_t slash = path.find_last_of('/');
  std::string cfg_path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                         "tokenizer_config.json";
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> cfg, format::ReadOptionalSmallFile(cfg_path, uint64_t{1} << 26));
  if (cfg.has_value()) config = std::move(*cfg);
  auto t = FromHfJson(json, config);
  if (!t.ok()) return Annotate(t.status(), path);
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(std::string_view text,
                                                                 std::string_view config_text) {
  try {
    return FromHfJsonUnchecked(text, config_text);
  } catch (const nlohmann::json::exception &e) {  // a field of the wrong JSON type
    return Meta(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJsonUnchecked(std::string_view text,
                                                                          std::string_view config_text) {
  // The bounded reader: nesting past its depth limit is refused before any copy or walk of it.
  STRATA_ASSIGN_OR_RETURN(Json j, format::ParseJson(text, MOE_ERR_FORMAT_METADATA, "tokenizer.json"));
  if (!j.is_object()) return Meta("tokenizer.json: not a JSON object");
  Json cfg;
  if (!config_text.empty()) {
    STRATA_ASSIGN_OR_RETURN(cfg, format::ParseJson(config_text, MOE_ERR_FORMAT_METADATA, "tokenizer_config.json"));
    if (!cfg.is_object()) return Meta("tokenizer_config.json: not a JSON object");
  }
  if (!j.contains("model") || !j["model"].is_object()) return Meta("tokenizer.json: model: missing");
  const Json &m = j["model"];
  std::string mtype = m.value("type", std::string("BPE"));
  if (mtype != "BPE") return Unsupported(absl::StrCat("tokenizer.json: model.type '", mtype, "' is not supported (BPE)"));
  if (m.contains("continuing_subword_prefix") && !m["continuing_subword_prefix"].is_null())
    return Unsupported("tokenizer.json: model.continuing_subword_prefix is not supported");
  if (m.contains("end_of_word_suffix") && !m["end_of_word_suffix"].is_null())
    return Unsupported("tokenizer.json: model.end_of_word_suffix is not supported");

  HfPipeline hp;
  STRATA_RETURN_IF_ERROR(WalkPre(j.value("pre_tokenizer", Json()), &hp));
  STRATA_RETURN_IF_ERROR(WalkNormalizer(j.value("normalizer", Json()), &hp));
  if (!hp.byte_level && j.contains("decoder") && j["decoder"].is_object() &&
      j["decoder"].value("type", std::string()) == "ByteLevel")
    hp.byte_level = true;

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  if (hp.byte_level) {
    t->model_ = TokenizerModel::kByteLevelBpe;
    const auto &r = hp.regexes;
    if (r.size() == 1 && r[0] == kReGpt2) t->pre_ = PreTokenizer::kGpt2;
    else if (r.size() == 1 && r[0] == kReLlama3) t->pre_ = PreTokenizer::kLlama3;
    else if (r.size() == 1 && r[0] == kReQwen2) t->pre_ = PreTokenizer::kQwen2;
    else if (r.size() == 1 && r[0] == kReO200k) t->pre_ = PreTokenizer::kO200k;
    else if (r.size() == 3 && r[0] == kReDsv3Digits && r[1] == kReDsv3Cjk && r[2] == kReDsv3Words)
      t->pre_ = PreTokenizer::kDeepseekV3;
    else
      return Unsupported(absl::StrCat("tokenizer.json: pre_tokenizer: regex split '",
                                      r.empty() ? std::string("(none)") : r[0].substr(0, 160),
                                      r.size() > 1 ? "', ..." : "'", " is not one Strata implements"));
    if (hp.spm_prepend || hp.spm_replace)
      return Unsupported("tokenizer.json: a U+2581 normalizer with a ByteLevel pre-tokenizer");
  } else {
    if (!hp.regexes.empty()) return Unsupported("tokenizer.json: a Split pre-tokenizer without ByteLevel");
    t->model_ = TokenizerModel::kSentencePieceBpe;
    t->pre_ = PreTokenizer::kNone;
    t->add_space_prefix_ = hp.spm_prepend;
    t->space_prefix_first_only_ = hp.spm_first_only;
    if (!hp.spm_replace)
      return Unsupported("tokenizer.json: BPE without ByteLevel needs the U+2581 space replacement");
  }
  t->ignore_merges_ = m.value("ignore_merges", false);
  t->byte_fallback_ = m.value("byte_fallback", false);
  t->fuse_unk_ = m.value("fuse_unk", false);

  // Vocabulary, then added tokens (which may extend it).
  if (!m.contains("vocab") || !m["vocab"].is_object()) return Meta("tokenizer.json: model.vocab: missing or not an object");
  std::vector<std::pair<int64_t, std::string>> entries;
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return Meta(absl::StrCat("tokenizer.json: model.vocab['", it.key(), "']: not an integer id"));
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 31) - 1) return Meta(absl::StrCat("tokenizer.json: model.vocab['", it.key(), "']: id out of range"));
    entries.emplace_back(id, it.key());
    max_id = std::max(max_id, id);
  }
  struct Added { int64_t id; std::string content; bool special; };
  std::vector<Added> added;
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) return Meta("tokenizer.json: added_tokens: not an array");
    for (size_t k = 0; k < j["added_tokens"].size(); ++k) {
      const Json &a = j["added_tokens"][k];
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return Meta(strata::StrFormat("tokenizer.json: added_tokens[%d]: needs an integer id and a content string", k));
      int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 31) - 1) return Meta(strata::StrFormat("tokenizer.json: added_tokens[%d]: id out of range", k));
      added.push_back({id, a["content"].get<std::string>(), a.value("special", false)});
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) return Meta("tokenizer.json: model.vocab: empty");
  if (max_id > 4 * static_cast<int64_t>(entries.size() + added.size()) + 1024)
    return Meta("tokenizer.json: model.vocab: ids are too sparse");
  t->tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
  t->attrs_.assign(static_cast<size_t>(max_id + 1), TokenAttr::kUnused);
  std::vector<bool> seen(static_cast<size_t>(max_id + 1), false);
  for (auto &[id, s] : entries) {
    if (seen[id]) return Meta(strata::StrFormat("tokenizer.json: model.vocab: id %d is used twice", id));
    seen[id] = true;
    t->tokens_[id] = s;
    t->attrs_[id] = TokenAttr::kNormal;
  }
  std::string unk = m.contains("unk_token") && m["unk_token"].is_string() ? m["unk_token"].get<std::string>() : "";
  for (const Added &a : added) {
    if (seen[a.id] && t->tokens_[a.id] != a.content)
      return Meta(strata::StrFormat("tokenizer.json: added_tokens: id %d is '%s' in model.vocab", a.id, t->tokens_[a.id]));
    seen[a.id] = true;
    t->tokens_[a.id] = a.content;
    t->attrs_[a.id] = a.special ? (a.content == unk ? TokenAttr::kUnknown : TokenAttr::kControl) : TokenAttr::kUserDefined;
  }
  STRATA_RETURN_IF_ERROR(t->Finish("tokenizer.json: model.vocab"));
  if (!unk.empty()) {
    auto it = t->token_to_id_.find(unk);
    if (it == t->token_to_id_.end()) return Meta(absl::StrCat("tokenizer.json: model.unk_token '", unk, "' is not in the vocabulary"));
    t->unk_ = it->second;
  }

  if (m.contains("merges")) {
    if (!m["merges"].is_array()) return Meta("tokenizer.json: model.merges: not an array");
    const Json &ms = m["merges"];
    for (size_t r = 0; r < ms.size(); ++r) {
      std::string a, b;
      if (ms[r].is_string()) {
        std::string s = ms[r].get<std::string>();
        size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) return Meta(strata::StrFormat("tokenizer.json: model.merges[%d]: '%s' is not 'left right'", r, s));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (ms[r].is_array() && ms[r].size() == 2 && ms[r][0].is_string() && ms[r][1].is_string()) {
        a = ms[r][0].get<std::string>();
        b = ms[r][1].get<std::string>();
      } else {
        return Meta(strata::StrFormat("tokenizer.json: model.merges[%d]: not a string or a pair of strings", r));
      }
      auto ia = t->token_to_id_.find(a), ib = t->token_to_id_.find(b), ic = t->token_to_id_.find(a + b);
      const std::string *bad = ia == t->token_to_id_.end() ? &a : ib == t->token_to_id_.end() ? &b : nullptr;
      if (bad != nullptr)
        return Meta(strata::StrFormat("tokenizer.json: model.merges[%d]: '%s %s' names unknown token '%s'", r, a, b, *bad));
      if (ic == t->token_to_id_.end())
        return Meta(strata::StrFormat("tokenizer.json: model.merges[%d]: '%s %s' makes '%s', not in the vocabulary", r, a, b, a + b));
      uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
      t->merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), ic->second));
    }
  }

  // BOS/EOS: tokenizer_config.json, else a TemplateProcessing post-processor that starts with a
  // special token.
  auto lookup = [&](const std::string &s, const char *key, int32_t *dst) -> absl::Status {
    if (s.empty()) return absl::OkStatus();
    auto it = t->token_to_id_.find(s);
    if (it == t->token_to_id_.end())
      return Meta(absl::StrCat("tokenizer_config.json: ", key, " '", s, "' is not in the vocabulary"));
    *dst = it->second;
    return absl::OkStatus();
  };
  const Json &pp = j.value("post_processor", Json());
  if (pp.is_object() && pp.value("type", std::string()) == "TemplateProcessing" && pp.contains("single") &&
      pp["single"].is_array() && !pp["single"].empty() && pp["single"][0].is_object() &&
      pp["single"][0].contains("SpecialToken")) {
    std::string s = pp["single"][0]["SpecialToken"].value("id", std::string());
    STRATA_RETURN_IF_ERROR(lookup(s, "post_processor", &t->bos_));
    t->add_bos_ = t->bos_ >= 0;
  }
  STRATA_RETURN_IF_ERROR(lookup(ConfigToken(cfg, "bos_token"), "bos_token", &t->bos_));
  STRATA_RETURN_IF_ERROR(lookup(ConfigToken(cfg, "eos_token"), "eos_token", &t->eos_));
  if (cfg.is_object() && cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean())
    t->add_bos_ = cfg["add_bos_token"].get<bool>() && t->bos_ >= 0;
  return t;
}

}  // namespace strata::text
