// Hand-written matchers for the pre-tokenizer regexes. Each Match* function returns the end of the
// match that the regex (leftmost alternative first, greedy quantifiers, backtracking) finds at a
// given start, or the start itself when nothing matches there. Positions index code points.
#include "lib/text/pretokenizer.h"

#include <cstdint>

#include "lib/text/unicode.h"

namespace strata::text {
namespace {

// The text as code points with their categories; position n is the end.
struct Cps {
  std::vector<uint32_t> cp;
  std::vector<Gc> gc;
  std::vector<size_t> byte;  // byte offset of each code point, plus the total at the end
  size_t n = 0;

  Cps(std::string_view s, size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      size_t len;
      uint32_t c = DecodeUtf8(s.substr(0, end), i, &len);
      cp.push_back(c);
      gc.push_back(Category(c));
      byte.push_back(i);
      i += len;
    }
    byte.push_back(end);
    n = cp.size();
  }
  bool L(size_t i) const { return i < n && IsLetter(gc[i]); }
  bool N(size_t i) const { return i < n && IsNumber(gc[i]); }
  bool P(size_t i) const { return i < n && IsPunct(gc[i]); }
  bool S(size_t i) const { return i < n && IsSymbol(gc[i]); }
  bool M(size_t i) const { return i < n && IsMark(gc[i]); }
  bool Ws(size_t i) const { return i < n && IsWhitespace(cp[i]); }
  bool CrLf(size_t i) const { return i < n && (cp[i] == '\r' || cp[i] == '\n'); }
  bool Is(size_t i, uint32_t c) const { return i < n && cp[i] == c; }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return i < n && !Ws(i) && !L(i) && !N(i); }
  // [^\r\n\p{L}\p{N}]
  bool Prefix(size_t i) const { return i < n && !CrLf(i) && !L(i) && !N(i); }
};

template <typename Pred>
size_t Run(const Cps &c, size_t i, Pred pred) {
  while (i < c.n && pred(i)) ++i;
  return i;
}

uint32_t Lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's|'t|'re|'ve|'m|'ll|'d, case-sensitive or (?i:...). Returns i when none matches.
size_t MatchContraction(const Cps &c, size_t i, bool icase) {
  if (!c.Is(i, '\'') || i + 1 >= c.n) return i;
  auto at = [&](size_t k) { return k < c.n ? (icase ? Lower(c.cp[k]) : c.cp[k]) : 0u; };
  uint32_t a = at(i + 1), b = at(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return i;
}

// \s*[\r\n]+ : the whitespace run up to and including its last \r or \n.
size_t MatchWsNewline(const Cps &c, size_t i) {
  size_t e = Run(c, i, [&](size_t k) { return c.Ws(k); });
  for (size_t k = e; k > i; --k)
    if (c.CrLf(k - 1)) return k;
  return i;
}

// \s+(?!\S)|\s+ : a whitespace run, leaving its last character to the next piece when a
// non-space follows and the run is longer than one.
size_t MatchWsTail(const Cps &c, size_t i) {
  size_t e = Run(c, i, [&](size_t k) { return c.Ws(k); });
  if (e == i) return i;
  if (e == c.n || e - i == 1) return e;
  return e - 1;
}

size_t MatchGpt2(const Cps &c, size_t i) {
  size_t e = MatchContraction(c, i, false);
  if (e > i) return e;
  size_t j = c.Is(i, ' ') ? i + 1 : i;
  if (c.L(j)) return Run(c, j, [&](size_t k) { return c.L(k); });
  if (c.N(j)) return Run(c, j, [&](size_t k) { return c.N(k); });
  if (c.Other(j)) return Run(c, j, [&](size_t k) { return c.Other(k); });
  return MatchWsTail(c, i);
}

// Llama-3 (max_digits 3) and Qwen2 (max_digits 1).
size_t MatchLlama3(const Cps &c, size_t i, size_t max_digits) {
  size_t e = MatchContraction(c, i, true);
  if (e > i) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.Prefix(i) && c.L(i + 1)) return Run(c, i + 1, [&](size_t k) { return c.L(k); });
  if (c.L(i)) return Run(c, i, [&](size_t k) { return c.L(k); });
  // \p{N}{1,k}
  if (c.N(i)) {
    e = i;
    while (e < c.n && e - i < max_digits && c.N(e)) ++e;
    return e;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t j = c.Is(i, ' ') ? i + 1 : i;
  if (c.Other(j)) {
    e = Run(c, j, [&](size_t k) { return c.Other(k); });
    return Run(c, e, [&](size_t k) { return c.CrLf(k); });
  }
  e = MatchWsNewline(c, i);
  if (e > i) return e;
  return MatchWsTail(c, i);
}

// o200k's letter classes: A = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], B = [\p{Ll}\p{Lm}\p{Lo}\p{M}].
bool ClassA(const Cps &c, size_t i) {
  if (i >= c.n) return false;
  Gc g = c.gc[i];
  return g == Gc::kLu || g == Gc::kLt || g == Gc::kLm || g == Gc::kLo || IsMark(g);
}
bool ClassB(const Cps &c, size_t i) {
  if (i >= c.n) return false;
  Gc g = c.gc[i];
  return g == Gc::kLl || g == Gc::kLm || g == Gc::kLo || IsMark(g);
}

// A*B+ from i, as a backtracking engine finds it; returns i on failure.
size_t MatchAStarBPlus(const Cps &c, size_t i) {
  size_t e = Run(c, i, [&](size_t k) { return ClassA(c, k); });
  if (ClassB(c, e)) return Run(c, e, [&](size_t k) { return ClassB(c, k); });
  // Give back A characters until one can start B+; B+ then stops at the next (non-B) character.
  for (size_t j = e; j > i; --j)
    if (ClassB(c, j - 1)) return j;
  return i;
}

// A+B* from i; returns i on failure.
size_t MatchAPlusBStar(const Cps &c, size_t i) {
  size_t e = Run(c, i, [&](size_t k) { return ClassA(c, k); });
  if (e == i) return i;
  return Run(c, e, [&](size_t k) { return ClassB(c, k); });
}

size_t MatchO200k(const Cps &c, size_t i) {
  for (auto letters : {MatchAStarBPlus, MatchAPlusBStar}) {
    // [^\r\n\p{L}\p{N}]? is tried with the prefix character first, then without it.
    if (c.Prefix(i)) {
      size_t e = letters(c, i + 1);
      if (e > i + 1) return MatchContraction(c, e, true);
    }
    size_t e = letters(c, i);
    if (e > i) return MatchContraction(c, e, true);
  }
  if (c.N(i)) {
    size_t e = i;
    while (e < c.n && e - i < 3 && c.N(e)) ++e;
    return e;
  }
  size_t j = c.Is(i, ' ') ? i + 1 : i;
  if (c.Other(j)) {
    size_t e = Run(c, j, [&](size_t k) { return c.Other(k); });
    return Run(c, e, [&](size_t k) { return c.CrLf(k) || c.Is(k, '/'); });
  }
  size_t e = MatchWsNewline(c, i);
  if (e > i) return e;
  return MatchWsTail(c, i);
}

size_t MatchDigits3(const Cps &c, size_t i) {
  size_t e = i;
  while (e < c.n && e - i < 3 && c.N(e)) ++e;
  return e;
}

bool IsCjkKana(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) ||
         (cp >= 0x30A0 && cp <= 0x30FF);
}

size_t MatchCjkKana(const Cps &c, size_t i) {
  return Run(c, i, [&](size_t k) { return IsCjkKana(c.cp[k]); });
}

bool AsciiPunct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}
bool AsciiLetter(uint32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'); }

// [!"#...~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|
// \s+(?!\S)|\s+
size_t MatchDeepseekWords(const Cps &c, size_t i) {
  if (i + 1 < c.n && AsciiPunct(c.cp[i]) && AsciiLetter(c.cp[i + 1]))
    return Run(c, i + 1, [&](size_t k) { return AsciiLetter(c.cp[k]); });
  auto lm = [&](size_t k) { return c.L(k) || c.M(k); };
  bool prefix = i < c.n && !c.CrLf(i) && !c.L(i) && !c.P(i) && !c.S(i);
  if (prefix && lm(i + 1)) return Run(c, i + 1, lm);
  if (lm(i)) return Run(c, i, lm);
  auto ps = [&](size_t k) { return c.P(k) || c.S(k); };
  size_t j = c.Is(i, ' ') ? i + 1 : i;
  if (ps(j)) {
    size_t e = Run(c, j, ps);
    return Run(c, e, [&](size_t k) { return c.CrLf(k); });
  }
  size_t e = MatchWsNewline(c, i);
  if (e > i) return e;
  return MatchWsTail(c, i);
}

// Appends the isolated split of text[begin, end) by `match` to `out`.
template <typename Match>
void SplitIsolated(std::string_view text, size_t begin, size_t end, Match match,
                   std::vector<std::pair<size_t, size_t>> *out) {
  Cps c(text, begin, end);
  size_t gap = 0, i = 0;
  while (i < c.n) {
    size_t e = match(c, i);
    if (e > i) {
      if (gap < i) out->emplace_back(c.byte[gap], c.byte[i]);
      out->emplace_back(c.byte[i], c.byte[e]);
      i = gap = e;
    } else {
      ++i;
    }
  }
  if (gap < c.n) out->emplace_back(c.byte[gap], c.byte[c.n]);
}

}  // namespace

const char *PreTokenizerName(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kNone: return "none";
    case PreTokenizer::kGpt2: return "gpt-2";
    case PreTokenizer::kLlama3: return "llama-bpe";
    case PreTokenizer::kQwen2: return "qwen2";
    case PreTokenizer::kDeepseekV3: return "deepseek-v3";
    case PreTokenizer::kO200k: return "gpt-4o";
  }
  return "?";
}

std::vector<std::pair<size_t, size_t>> PreTokenize(PreTokenizer p, std::string_view text) {
  std::vector<std::pair<size_t, size_t>> out;
  if (text.empty()) return out;
  switch (p) {
    case PreTokenizer::kNone:
      out.emplace_back(0, text.size());
      break;
    case PreTokenizer::kGpt2:
      SplitIsolated(text, 0, text.size(), MatchGpt2, &out);
      break;
    case PreTokenizer::kLlama3:
      SplitIsolated(text, 0, text.size(), [](const Cps &c, size_t i) { return MatchLlama3(c, i, 3); },
                    &out);
      break;
    case PreTokenizer::kQwen2:
      SplitIsolated(text, 0, text.size(), [](const Cps &c, size_t i) { return MatchLlama3(c, i, 1); },
                    &out);
      break;
    case PreTokenizer::kO200k:
      SplitIsolated(text, 0, text.size(), MatchO200k, &out);
      break;
    case PreTokenizer::kDeepseekV3: {
      std::vector<std::pair<size_t, size_t>> a, b;
      SplitIsolated(text, 0, text.size(), MatchDigits3, &a);
      for (auto [s, e] : a) SplitIsolated(text, s, e, MatchCjkKana, &b);
      for (auto [s, e] : b) SplitIsolated(text, s, e, MatchDeepseekWords, &out);
      break;
    }
  }
  return out;
}

}  // namespace strata::text
