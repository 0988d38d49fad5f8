// Pre-tokenizers: the regex splits of the byte-level BPE models, written by hand (no regex engine)
// to give exactly the spans Oniguruma gives for each pattern, including its backtracking. Every
// split is "isolated": matches and the unmatched gaps between them are both pieces, so the pieces
// always tile the input. Input need not be valid UTF-8 (invalid bytes count as U+FFFD, category So).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

namespace strata::text {

enum class PreTokenizer {
  kNone,        // the whole text is one piece (SentencePiece-style models)
  kGpt2,        // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,      // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|...
  kQwen2,       // as kLlama3 with \p{N} (one digit per piece)
  kDeepseekV3,  // three splits in sequence: \p{N}{1,3}; [CJK/kana]+; letters/punctuation/whitespace
  kO200k,       // GPT-4o: case-aware letter runs with optional contraction, \p{N}{1,3}, ...
};

// "gpt-2", "qwen2", ... (the GGUF tokenizer.ggml.pre spelling).
const char *PreTokenizerName(PreTokenizer p);

// Splits `text` into byte spans [begin, end) that tile it in order. Empty text gives no spans.
std::vector<std::pair<size_t, size_t>> PreTokenize(PreTokenizer p, std::string_view text);

}  // namespace strata::text
