// Tokenizers for the models Strata runs: byte-level BPE (GGUF tokenizer.ggml.model "gpt2"; HF
// tokenizer.json with a ByteLevel pre-tokenizer) and SentencePiece-style BPE with byte fallback
// ("llama"; HF BPE with byte_fallback). Loading validates everything: a Tokenizer that exists
// encodes every byte string without failing, and decoding never emits half a UTF-8 character when
// streamed. Encode adds no BOS/EOS: callers consult add_bos()/bos().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/util/hash_containers.h"
#include "lib/format/gguf.h"
#include "lib/text/pretokenizer.h"
#include "lib/util/status.h"

namespace strata::text {

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
};

// tokenizer.ggml.token_type values.
enum class TokenAttr : uint8_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

enum class TokenizerModel {
  kByteLevelBpe,       // bytes mapped to printable code points (GPT-2), merges by rank
  kSentencePieceBpe,   // U+2581 for spaces, byte fallback <0xXX>; merges by rank or by score
};

// The largest tokenizer.json Strata reads.
inline constexpr uint64_t kHfTokenizerMaxBytes = uint64_t{1} << 30;

class Tokenizer {
 public:
  // From GGUF metadata (tokenizer.ggml.*). Malformed metadata is MOE_ERR_FORMAT_METADATA naming the
  // key; an unknown tokenizer.ggml.model or .pre is MOE_ERR_UNSUPPORTED naming the key and value.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const format::GgufFile &gguf);
  // From a Hugging Face tokenizer.json; tokenizer_config.json next to it is read when present
  // (bos_token, eos_token, add_bos_token). Errors: MOE_ERR_IO_* (reading), MOE_ERR_FORMAT_METADATA
  // (bad JSON or fields, naming the field), MOE_ERR_UNSUPPORTED (a model, normalizer or
  // pre-tokenizer Strata does not implement, named).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfFile(const std::string &tokenizer_json_path);
  // The same with tokenizer.json's text already read from `tokenizer_json_path` (at most
  // kHfTokenizerMaxBytes), so a caller that opened it once does not open it again.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfFile(const std::string &tokenizer_json_path,
                                                               std::string_view tokenizer_json);
  // The same from the texts; `config_json` may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(std::string_view tokenizer_json,
                                                               std::string_view config_json);

  // Token ids of `text` (any bytes; invalid UTF-8 is tokenized byte by byte). With parse_special,
  // control tokens (and the unknown token) written in the text become those tokens; user-defined
  // (added, non-special) tokens always do. No BOS/EOS is added.
  // Thread-safety: safe to call concurrently (the per-word cache is locked).
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;
  // Like Encode with parse_special, except that a control token is matched only where its whole
  // spelling lies inside one of `special_ranges` (sorted, disjoint): the text a chat template wrote
  // itself. Text outside them (a message's content) never becomes a control token, yet the runs
  // between control tokens are tokenized whole, so without such spellings in the content the ids
  // equal Encode(text, true).
  std::vector<int32_t> EncodeSpecialWithin(std::string_view text, absl::Span<const TextRange> special_ranges) const;

  // The bytes token `id` stands for: byte-level pieces decoded to raw bytes, U+2581 turned back to
  // a space, <0xXX> byte tokens as the one byte, control and user-defined tokens as their text.
  // May be a fragment of a UTF-8 character. "" for an id outside [0, vocab_size()).
  std::string TokenToPiece(int32_t id) const;
  // Concatenated pieces; SentencePiece-style models drop the space the encoder prepended.
  // MOE_ERR_INVALID_ARGUMENT naming the first id outside [0, vocab_size()). Bytes are returned as
  // they are (possibly invalid UTF-8 when the ids split a character).
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos() const { return bos_; }  // -1 when the model has none
  int32_t eos() const { return eos_; }  // -1 when the model has none
  bool add_bos() const { return add_bos_; }
  TokenAttr attr(int32_t id) const;
  // Control or unknown: what Encode matches only with parse_special.
  bool IsSpecial(int32_t id) const;
  // The token as stored in the vocabulary ("Ġhello", "▁hello", "<0x0A>"); "" when out of range.
  const std::string &token_text(int32_t id) const;
  TokenizerModel model() const { return model_; }
  PreTokenizer pre_tokenizer() const { return pre_; }
  // Whether decoding drops one leading space (the one the encoder prepends).
  bool strips_leading_space() const { return model_ == TokenizerModel::kSentencePieceBpe && add_space_prefix_; }

 private:
  struct Sym;
  Tokenizer() = default;
  // FromHfJson without its catch of nlohmann::json exceptions (fields of the wrong type).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJsonUnchecked(std::string_view tokenizer_json,
                                                                        std::string_view config_json);
  absl::Status Finish(const char *where);
  void EncodeText(std::string_view text, bool at_start, std::vector<int32_t> *out) const;
  // Encode's loop; `special_at(i, n)` says whether a control token of n bytes may match at byte i.
  template <typename SpecialAt>
  std::vector<int32_t> EncodeImpl(std::string_view text, SpecialAt special_at) const;
  void EncodeWord(std::string_view word, std::vector<int32_t> *out) const;
  void BpeWord(std::string_view word, std::vector<int32_t> *out) const;
  void MergeSymbols(std::vector<Sym> *syms) const;
  bool PairRank(int32_t a, int32_t b, double *prio, int32_t *merged) const;

  TokenizerModel model_ = TokenizerModel::kByteLevelBpe;
  PreTokenizer pre_ = PreTokenizer::kGpt2;
  std::vector<std::string> tokens_;  // vocabulary form
  std::vector<std::string> pieces_;  // raw bytes (TokenToPiece)
  std::vector<TokenAttr> attrs_;
  std::vector<float> scores_;        // SentencePiece from GGUF: merge by score instead of rank
  HashMap<std::string, int32_t> token_to_id_;
  HashMap<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a<<32|b) -> (rank, merged)
  int32_t byte_ids_[256];            // byte-level: byte's char token; SentencePiece: <0xXX> (or -1)
  bool merge_by_score_ = false;
  bool ignore_merges_ = false;       // a word already in the vocabulary is one token (Llama-3)
  bool byte_fallback_ = true;
  bool fuse_unk_ = false;
  bool add_space_prefix_ = true;     // SentencePiece: prepend U+2581 to each text segment
  bool space_prefix_first_only_ = false;  // ... only to the segment at the start of the text
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  // Added tokens matched in the text, by first byte, longest first.
  std::vector<int32_t> added_by_byte_[256];

  mutable absl::Mutex cache_mu_;
  mutable HashMap<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

// Turns a stream of token ids into text a piece at a time, never returning an incomplete or
// invalid UTF-8 sequence: bytes of a character split across tokens are held back until it is
// complete; bytes that can never form a character come out as U+FFFD. Single-threaded.
class StreamDetokenizer {
 public:
  explicit StreamDetokenizer(const Tokenizer &tok) : tok_(tok) {}
  // The text that became complete with `id` (possibly empty). Out-of-range ids add nothing.
  std::string Push(int32_t id);
  // What is still held back, as U+FFFD for an unfinished character; resets the stream.
  std::string Finish();

 private:
  const Tokenizer &tok_;
  std::string pending_;
  bool at_start_ = true;
};

}  // namespace strata::text
