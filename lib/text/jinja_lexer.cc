// The Jinja lexer, following jinja2's rules under transformers' settings: trim_blocks (a newline
// right after a block or comment tag is dropped), lstrip_blocks (spaces and tabs between a line's
// start and a block or comment tag are dropped), `-` / `+` on a tag strip or keep whitespace,
// {% raw %} copies text verbatim, newlines are normalised to \n and one trailing newline is dropped.
#include <cstring>

#include "lib/text/jinja_ast.h"
#include "lib/text/unicode.h"

namespace strata::text::jinja {
namespace {

absl::Status LexError(int line, const std::string &what) {
  return MakeError(MOE_ERR_INVALID_ARGUMENT, "chat template line " + std::to_string(line) + ": " + what);
}

bool StartsAt(std::string_view s, size_t at, std::string_view p) { return s.substr(at, p.size()) == p; }

// Whitespace as Python's re \s sees it in a str pattern.
size_t SkipSpace(std::string_view s, size_t at) {
  size_t len;
  while (at < s.size() && PySpaceAt(s, at, &len)) at += len;
  return at;
}

bool AllSpace(std::string_view s) { return !s.empty() && SkipSpace(s, 0) == s.size(); }

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t tag = FindTag(pos);
      if (tag == std::string::npos) {
        Emit(Tok::kText, src_.substr(pos), pos);
        break;
      }
      const char type = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      const bool line_starting = pos == 0 || src_[pos - 1] == '\n';
      std::string text = StripBefore(src_.substr(pos, tag - pos), sign, type != '{', line_starting);
      Emit(Tok::kText, std::move(text), pos);
      if (type == '#') {
        STRATA_ASSIGN_OR_RETURN(pos, SkipComment(tag, after));
        continue;
      }
      if (type == '%') {
        size_t raw_end;
        if (IsRawBegin(after, &raw_end)) {
          STRATA_ASSIGN_OR_RETURN(pos, Raw(tag, raw_end));
          continue;
        }
      }
      STRATA_ASSIGN_OR_RETURN(pos, Tag(type == '%', tag, after));
    }
    tokens_.push_back({Tok::kEof, "", LineAt(src_.size())});
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t at) {
    for (; line_pos_ < at && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }

  void Emit(Tok t, std::string text, size_t at) {
    if (t == Tok::kText && text.empty()) return;
    tokens_.push_back({t, std::move(text), LineAt(at)});
  }

  size_t FindTag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    }
    return std::string::npos;
  }

  // The text before a tag with `-` (strip all whitespace) or lstrip_blocks applied.
  static std::string StripBefore(std::string text, char sign, bool block_or_comment, bool line_starting) {
    if (sign == '-') return std::string(PyStrip(text, false, true));
    if (sign != '+' && block_or_comment) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && AllSpace(std::string_view(text).substr(l_pos))) text.resize(l_pos);
    }
    return text;
  }

  // After a closing tag: `-` strips all whitespace, a plain block/comment end drops one newline.
  size_t AfterEnd(size_t at, char sign, bool trims_newline) const {
    if (sign == '-') return SkipSpace(src_, at);
    if (sign != '+' && trims_newline && at < src_.size() && src_[at] == '\n') return at + 1;
    return at;
  }

  absl::StatusOr<size_t> SkipComment(size_t tag, size_t body) {
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) return LexError(LineAt(tag), "a comment ({#) is never closed with #}");
    char sign = 0;
    if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    return AfterEnd(end + 2, sign, true);
  }

  // {%[-+] raw [-]%}: sets *end past it.
  bool IsRawBegin(size_t at, size_t *end) const {
    at = SkipSpace(src_, at);
    if (!StartsAt(src_, at, "raw")) return false;
    at = SkipSpace(src_, at + 3);
    if (StartsAt(src_, at, "-%}")) {
      *end = SkipSpace(src_, at + 3);
      return true;
    }
    if (StartsAt(src_, at, "%}")) {
      *end = at + 2;
      return true;
    }
    return false;
  }

  absl::StatusOr<size_t> Raw(size_t tag, size_t body) {
    for (size_t k = src_.find("{%", body); k != std::string::npos; k = src_.find("{%", k + 2)) {
      size_t at = k + 2;
      char sign = 0;
      if (at < src_.size() && (src_[at] == '-' || src_[at] == '+')) sign = src_[at++];
      at = SkipSpace(src_, at);
      if (!StartsAt(src_, at, "endraw")) continue;
      at = SkipSpace(src_, at + 6);
      char end_sign = 0;
      if (at < src_.size() && (src_[at] == '-' || src_[at] == '+')) end_sign = src_[at++];
      if (!StartsAt(src_, at, "%}")) continue;
      const bool line_starting = src_[body - 1] == '\n';
      Emit(Tok::kText, StripBefore(src_.substr(body, k - body), sign, true, line_starting), body);
      return AfterEnd(at + 2, end_sign, true);
    }
    return LexError(LineAt(tag), "{% raw %} is never closed with {% endraw %}");
  }

  // The tokens of a {% ... %} or {{ ... }} tag; returns the position after it.
  absl::StatusOr<size_t> Tag(bool block, size_t tag, size_t at) {
    Emit(block ? Tok::kBlockBegin : Tok::kVarBegin, block ? "{%" : "{{", tag);
    std::string brackets;
    const char *what = block ? "a block tag ({%)" : "an expression ({{)";
    while (true) {
      at = SkipSpace(src_, at);
      if (at >= src_.size()) return LexError(LineAt(tag), std::string(what) + " is never closed");
      if (brackets.empty()) {
        const char *close = block ? "%}" : "}}";
        for (char sign : {'-', '+', '\0'}) {
          if (sign == '+' && !block) continue;
          const size_t skip = sign ? 1 : 0;
          if ((sign == 0 || src_[at] == sign) && StartsAt(src_, at + skip, close)) {
            Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, close, at);
            return AfterEnd(at + skip + 2, sign, block);
          }
        }
      }
      const char c = src_[at];
      if (c == '\'' || c == '"') {
        STRATA_ASSIGN_OR_RETURN(at, String(at));
      } else if (c >= '0' && c <= '9') {
        at = Number(at);
      } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        size_t e = at;
        while (e < src_.size() && (src_[e] == '_' || std::isalnum(static_cast<unsigned char>(src_[e])))) ++e;
        Emit(Tok::kName, src_.substr(at, e - at), at);
        at = e;
      } else {
        static const char *kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}", ";"};
        const char *op = nullptr;
        for (const char *o : kOps)
          if (StartsAt(src_, at, o)) {
            op = o;
            break;
          }
        if (op == nullptr) {
          size_t len;
          DecodeUtf8(src_, at, &len);
          return LexError(LineAt(at), "unexpected character '" + src_.substr(at, len) + "'");
        }
        if (std::strchr("([{", op[0]) && op[1] == 0) {
          if (brackets.size() >= 256) return LexError(LineAt(at), "brackets nest deeper than 256");
          brackets.push_back(op[0]);
        } else if (std::strchr(")]}", op[0]) && op[1] == 0) {
          const char want = op[0] == ')' ? '(' : op[0] == ']' ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) {
            return LexError(LineAt(at), std::string("unexpected '") + op[0] + "'");
          }
          brackets.pop_back();
        }
        Emit(Tok::kOp, op, at);
        at += std::strlen(op);
      }
    }
  }

  size_t Number(size_t at) {
    auto digits = [&](size_t e) {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) ||
              (src_[e] == '_' && e + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e + 1])))))
        ++e;
      return e;
    };
    size_t e = digits(at);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        e = digits(x);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = at; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    Emit(is_float ? Tok::kFloat : Tok::kInt, text, at);
    return e;
  }

  // A quoted string with Python's escapes (jinja2 decodes them with unicode-escape).
  absl::StatusOr<size_t> String(size_t at) {
    const char q = src_[at];
    std::string out;
    size_t k = at + 1;
    for (; k < src_.size() && src_[k] != q; ++k) {
      if (src_[k] != '\\') {
        out += src_[k];
        continue;
      }
      if (++k >= src_.size()) break;
      const char e = src_[k];
      auto hex = [&](int n) -> bool {
        if (k + n >= src_.size()) return false;
        uint32_t cp = 0;
        for (int d = 1; d <= n; ++d) {
          const char h = src_[k + d];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
          cp = cp * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (cp > 0x10FFFF) return false;
        AppendUtf8(cp, &out);
        k += n;
        return true;
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          if (!hex(2)) return LexError(LineAt(k), "bad \\x escape in a string");
          break;
        case 'u':
          if (!hex(4)) return LexError(LineAt(k), "bad \\u escape in a string");
          break;
        case 'U':
          if (!hex(8)) return LexError(LineAt(k), "bad \\U escape in a string");
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = 0;
            int n = 0;
            while (n < 3 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7') cp = cp * 8 + (src_[k++] - '0'), ++n;
            --k;
            AppendUtf8(cp, &out);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    if (k >= src_.size()) return LexError(LineAt(at), "a string is never closed");
    Emit(Tok::kString, std::move(out), at);
    // An empty string must still be a token: Emit drops empty text only for kText.
    return k + 1;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(std::string_view source) {
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src)).Run();
}

}  // namespace strata::text::jinja
