// The Jinja parser: jinja2's grammar (precedence, `is` tests, filters, slices, chained comparisons)
// for the statements chat templates use. Nesting is bounded (kMaxDepth) so a hostile template
// cannot exhaust the stack; every error names the line.
#include <cstdlib>

#include "lib/text/jinja_ast.h"

namespace strata::text::jinja {
namespace {

constexpr int kMaxDepth = 200;

// Whether an expression or a body reads the variable `name` anywhere.
bool Mentions(const Expr *e, std::string_view name) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kName && e->name == name) return true;
  for (const auto &a : e->args)
    if (Mentions(a.get(), name)) return true;
  for (const auto &kv : e->kwargs)
    if (Mentions(kv.second.get(), name)) return true;
  return false;
}

bool Mentions(const Body &body, std::string_view name) {
  for (const auto &n : body) {
    if (Mentions(n->expr.get(), name) || Mentions(n->cond.get(), name)) return true;
    for (const auto &c : n->conds)
      if (Mentions(c.get(), name)) return true;
    for (const auto &d : n->defaults)
      if (Mentions(d.get(), name)) return true;
    for (const auto &b : n->branches)
      if (Mentions(b, name)) return true;
    if (Mentions(n->body, name) || Mentions(n->else_body, name)) return true;
  }
  return false;
}

const char *TokName(Tok t) {
  switch (t) {
    case Tok::kText:
      return "text";
    case Tok::kBlockBegin:
      return "'{%'";
    case Tok::kBlockEnd:
      return "'%}'";
    case Tok::kVarBegin:
      return "'{{'";
    case Tok::kVarEnd:
      return "'}}'";
    case Tok::kName:
      return "name";
    case Tok::kString:
      return "string";
    case Tok::kInt:
      return "integer";
    case Tok::kFloat:
      return "float";
    case Tok::kOp:
      return "operator";
    case Tok::kEof:
      return "end of template";
  }
  return "?";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  absl::StatusOr<std::shared_ptr<const Program>> Run() {
    auto prog = std::make_shared<Program>();
    std::string end;
    STRATA_RETURN_IF_ERROR(Subparse({}, &prog->body, &end));
    return std::shared_ptr<const Program>(std::move(prog));
  }

 private:
  // --- token stream ---
  const Token &Cur() const { return t_[pos_]; }
  const Token &Peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  bool IsName(std::string_view n) const { return Cur().type == Tok::kName && Cur().text == n; }
  bool IsOp(std::string_view o) const { return Cur().type == Tok::kOp && Cur().text == o; }
  std::string Describe(const Token &tk) const {
    if (tk.type == Tok::kName || tk.type == Tok::kOp) return "'" + tk.text + "'";
    return TokName(tk.type);
  }
  absl::Status Error(const std::string &what) const {
    return MakeError(MOE_ERR_INVALID_ARGUMENT, "chat template line " + std::to_string(Cur().line) + ": " + what);
  }
  absl::Status Unexpected(const std::string &expected) const {
    return Error("expected " + expected + ", got " + Describe(Cur()));
  }
  absl::Status ExpectOp(std::string_view o) {
    if (!IsOp(o)) return Unexpected("'" + std::string(o) + "'");
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectName(std::string_view n) {
    if (!IsName(n)) return Unexpected("'" + std::string(n) + "'");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Identifier() {
    if (Cur().type != Tok::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }
  absl::Status BlockEnd() {
    if (Cur().type != Tok::kBlockEnd) return Unexpected("'%}'");
    Next();
    return absl::OkStatus();
  }

  // A left-deep chain (a + b + c, x|f|g, a.b.c) nests its tree one level per link: each link
  // counts against the same bound as nested parentheses.
  absl::Status Link(int *links) {
    if (++*links + depth_ > kMaxDepth)
      return Error("an expression chains more than " + std::to_string(kMaxDepth) + " operations");
    return absl::OkStatus();
  }

  struct DepthGuard {
    explicit DepthGuard(int *d) : d(d) { ++*d; }
    ~DepthGuard() { --*d; }
    int *d;
  };

  // --- statements ---

  // Parses nodes until a block tag whose name is in `ends` (left in *end, consumed with its name);
  // with no `ends`, until the end of the template.
  absl::Status Subparse(std::initializer_list<std::string_view> ends, Body *body, std::string *end) {
    DepthGuard g(&depth_);
    if (depth_ > kMaxDepth) return Error("blocks nest deeper than " + std::to_string(kMaxDepth));
    while (true) {
      const Token &tk = Cur();
      if (tk.type == Tok::kEof) {
        if (ends.size() == 0) return absl::OkStatus();
        std::string want;
        for (auto e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        return Error("unexpected end of template: the block needs " + want);
      }
      if (tk.type == Tok::kText) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kText;
        n->line = tk.line;
        n->text = tk.text;
        body->push_back(std::move(n));
        Next();
        continue;
      }
      if (tk.type == Tok::kVarBegin) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::kOutput;
        n->line = tk.line;
        Next();
        STRATA_ASSIGN_OR_RETURN(n->expr, Tuple(true, false, {}));
        if (Cur().type != Tok::kVarEnd) return Unexpected("'}}'");
        Next();
        body->push_back(std::move(n));
        continue;
      }
      if (tk.type != Tok::kBlockBegin) return Unexpected("text or a tag");
      Next();
      if (Cur().type != Tok::kName) return Unexpected("a statement name after '{%'");
      for (auto e : ends) {
        if (Cur().text == e) {
          *end = Cur().text;
          Next();
          return absl::OkStatus();
        }
      }
      STRATA_RETURN_IF_ERROR(Statement(body));
    }
  }

  absl::Status Statement(Body *body) {
    const std::string name = Cur().text;
    const int line = Cur().line;
    auto n = std::make_unique<Node>();
    n->line = line;
    Next();
    if (name == "if") {
      n->kind = NodeKind::kIf;
      while (true) {
        STRATA_ASSIGN_OR_RETURN(ExprPtr c, Tuple(false, false, {}));
        n->conds.push_back(std::move(c));
        STRATA_RETURN_IF_ERROR(BlockEnd());
        n->branches.emplace_back();
        std::string end;
        STRATA_RETURN_IF_ERROR(Subparse({"elif", "else", "endif"}, &n->branches.back(), &end));
        if (end == "elif") continue;
        if (end == "else") {
          STRATA_RETURN_IF_ERROR(BlockEnd());
          n->branches.emplace_back();
          STRATA_RETURN_IF_ERROR(Subparse({"endif"}, &n->branches.back(), &end));
        }
        break;
      }
    } else if (name == "for") {
      n->kind = NodeKind::kFor;
      STRATA_RETURN_IF_ERROR(Targets(&n->targets));
      STRATA_RETURN_IF_ERROR(ExpectName("in"));
      STRATA_ASSIGN_OR_RETURN(n->expr, Tuple(false, false, {"recursive", "if"}));
      if (IsName("if")) {
        Next();
        STRATA_ASSIGN_OR_RETURN(n->cond, Expression(true));
      }
      if (IsName("recursive")) return Error("recursive for loops are not supported");
      STRATA_RETURN_IF_ERROR(BlockEnd());
      ++loop_depth_;
      std::string end;
      absl::Status st = Subparse({"endfor", "else"}, &n->body, &end);
      --loop_depth_;
      STRATA_RETURN_IF_ERROR(st);
      if (end == "else") {
        STRATA_RETURN_IF_ERROR(BlockEnd());
        STRATA_RETURN_IF_ERROR(Subparse({"endfor"}, &n->else_body, &end));
      }
    } else if (name == "set") {
      STRATA_ASSIGN_OR_RETURN(std::string target, Identifier());
      n->targets.push_back(target);
      if (IsOp(".")) {
        Next();
        STRATA_ASSIGN_OR_RETURN(n->text, Identifier());
      } else {
        while (IsOp(",")) {
          Next();
          STRATA_ASSIGN_OR_RETURN(std::string more, Identifier());
          n->targets.push_back(more);
        }
      }
      if (IsOp("=")) {
        Next();
        n->kind = NodeKind::kSet;
        STRATA_ASSIGN_OR_RETURN(n->expr, Tuple(true, false, {}));
      } else {
        if (n->targets.size() != 1 || !n->text.empty()) return Unexpected("'='");
        n->kind = NodeKind::kSetBlock;
        STRATA_RETURN_IF_ERROR(BlockEnd());
        std::string end;
        STRATA_RETURN_IF_ERROR(Subparse({"endset"}, &n->body, &end));
      }
    } else if (name == "macro" || name == "call") {
      n->kind = name == "macro" ? NodeKind::kMacro : NodeKind::kCallBlock;
      if (name == "macro") {
        STRATA_ASSIGN_OR_RETURN(n->text, Identifier());
      }
      if (IsOp("(")) {
        Next();
        while (!IsOp(")")) {
          if (!n->targets.empty()) STRATA_RETURN_IF_ERROR(ExpectOp(","));
          if (IsOp(")")) break;
          STRATA_ASSIGN_OR_RETURN(std::string param, Identifier());
          n->targets.push_back(param);
          ExprPtr def;
          if (IsOp("=")) {
            Next();
            STRATA_ASSIGN_OR_RETURN(def, Expression(true));
          }
          n->defaults.push_back(std::move(def));
        }
        Next();
      } else if (name == "macro") {
        return Unexpected("'('");
      }
      if (name == "call") {
        STRATA_ASSIGN_OR_RETURN(n->expr, Expression(true));
        if (n->expr->kind != ExprKind::kCall) return Error("{% call %} needs a call expression");
      }
      STRATA_RETURN_IF_ERROR(BlockEnd());
      const int saved = loop_depth_;
      loop_depth_ = 0;
      std::string end;
      absl::Status st = Subparse({name == "macro" ? "endmacro" : "endcall"}, &n->body, &end);
      loop_depth_ = saved;
      STRATA_RETURN_IF_ERROR(st);
      n->uses_varargs = Mentions(n->body, "varargs");
      n->uses_kwargs = Mentions(n->body, "kwargs");
    } else if (name == "filter") {
      n->kind = NodeKind::kFilterBlock;
      auto hole = std::make_unique<Expr>();
      hole->kind = ExprKind::kLiteral;
      hole->name = "\x01hole";  // the evaluator's stand-in for the block's text
      hole->line = line;
      STRATA_ASSIGN_OR_RETURN(n->expr, Filters(std::move(hole), /*first_without_pipe=*/true));
      STRATA_RETURN_IF_ERROR(BlockEnd());
      std::string end;
      STRATA_RETURN_IF_ERROR(Subparse({"endfilter"}, &n->body, &end));
    } else if (name == "generation" || name == "with") {
      // {% generation %} is transformers' marker for assistant text (no output of its own);
      // {% with a = x %} opens a scope with those names set.
      n->kind = NodeKind::kScope;
      while (name == "with" && Cur().type == Tok::kName) {
        auto set = std::make_unique<Node>();
        set->kind = NodeKind::kSet;
        set->line = Cur().line;
        set->targets.push_back(Cur().text);
        Next();
        STRATA_RETURN_IF_ERROR(ExpectOp("="));
        STRATA_ASSIGN_OR_RETURN(set->expr, Expression(true));
        n->body.push_back(std::move(set));
        if (!IsOp(",")) break;
        Next();
      }
      STRATA_RETURN_IF_ERROR(BlockEnd());
      std::string end;
      STRATA_RETURN_IF_ERROR(Subparse({name == "with" ? "endwith" : "endgeneration"}, &n->body, &end));
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Error("'" + name + "' outside a for loop");
      n->kind = name == "break" ? NodeKind::kBreak : NodeKind::kContinue;
    } else if (name == "include" || name == "extends" || name == "import" || name == "from" || name == "block") {
      return Error("'{% " + name + " %}' is not supported: a chat template is a single template");
    } else if (name.compare(0, 3, "end") == 0 || name == "elif" || name == "else") {
      return Error("'{% " + name + " %}' closes no open block");
    } else {
      return Error("unknown tag '" + name + "'");
    }
    STRATA_RETURN_IF_ERROR(BlockEnd());  // the statement's %}, or its end tag's
    body->push_back(std::move(n));
    return absl::OkStatus();
  }

  // for-loop targets: a name or names separated by commas, optionally in parentheses.
  absl::Status Targets(std::vector<std::string> *out) {
    const bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      STRATA_ASSIGN_OR_RETURN(std::string n, Identifier());
      out->push_back(n);
      if (!IsOp(",")) break;
      Next();
      if (paren && IsOp(")")) break;
    }
    if (paren) STRATA_RETURN_IF_ERROR(ExpectOp(")"));
    return absl::OkStatus();
  }

  // --- expressions ---
  ExprPtr Make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  bool TupleEnd(std::initializer_list<std::string_view> extra) const {
    const Token &tk = Cur();
    if (tk.type == Tok::kVarEnd || tk.type == Tok::kBlockEnd || tk.type == Tok::kEof) return true;
    if (tk.type == Tok::kOp && (tk.text == ")" || tk.text == "]" || tk.text == "}")) return true;
    if (tk.type == Tok::kName)
      for (auto e : extra)
        if (tk.text == e) return true;
    return false;
  }

  // Expressions separated by commas make a tuple (jinja2's parse_tuple).
  absl::StatusOr<ExprPtr> Tuple(bool with_condexpr, bool explicit_parens,
                                std::initializer_list<std::string_view> extra) {
    const int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) STRATA_RETURN_IF_ERROR(ExpectOp(","));
      if (TupleEnd(extra)) break;
      STRATA_ASSIGN_OR_RETURN(ExprPtr e, Expression(with_condexpr));
      items.push_back(std::move(e));
      if (IsOp(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) return Unexpected("an expression");
    }
    ExprPtr t = Make(ExprKind::kTuple, line);
    t->args = std::move(items);
    return t;
  }

  absl::StatusOr<ExprPtr> Expression(bool with_condexpr) {
    DepthGuard g(&depth_);
    if (depth_ > kMaxDepth) return Error("expressions nest deeper than " + std::to_string(kMaxDepth));
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, Or());
    if (!with_condexpr) return e;
    int links = 0;
    while (IsName("if")) {
      STRATA_RETURN_IF_ERROR(Link(&links));
      const int line = Cur().line;
      Next();
      ExprPtr c = Make(ExprKind::kCond, line);
      STRATA_ASSIGN_OR_RETURN(ExprPtr test, Or());
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        STRATA_ASSIGN_OR_RETURN(otherwise, Expression(true));
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Or() {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, And());
    int links = 0;
    while (IsName("or")) {
      STRATA_RETURN_IF_ERROR(Link(&links));
      ExprPtr o = Make(ExprKind::kOr, Cur().line);
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, And());
      o->args.push_back(std::move(e));
      o->args.push_back(std::move(r));
      e = std::move(o);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> And() {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, Not());
    int links = 0;
    while (IsName("and")) {
      STRATA_RETURN_IF_ERROR(Link(&links));
      ExprPtr o = Make(ExprKind::kAnd, Cur().line);
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, Not());
      o->args.push_back(std::move(e));
      o->args.push_back(std::move(r));
      e = std::move(o);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Not() {
    if (IsName("not")) {
      DepthGuard g(&depth_);
      if (depth_ > kMaxDepth) return Error("expressions nest deeper than " + std::to_string(kMaxDepth));
      ExprPtr n = Make(ExprKind::kNot, Cur().line);
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr a, Not());
      n->args.push_back(std::move(a));
      return n;
    }
    return Compare();
  }

  absl::StatusOr<ExprPtr> Compare() {
    const int line = Cur().line;
    STRATA_ASSIGN_OR_RETURN(ExprPtr first, Math1());
    ExprPtr c;
    while (true) {
      std::string op;
      if (Cur().type == Tok::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                     Cur().text == ">" || Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().text == "in") {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      if (!c) {
        c = Make(ExprKind::kCompare, line);
        c->args.push_back(std::move(first));
      }
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, Math1());
      c->ops.push_back(op);
      c->args.push_back(std::move(r));
    }
    return c ? std::move(c) : std::move(first);
  }

  absl::StatusOr<ExprPtr> Binary(absl::StatusOr<ExprPtr> (Parser::*sub)(),
                                 std::initializer_list<std::string_view> ops) {
    STRATA_ASSIGN_OR_RETURN(ExprPtr e, (this->*sub)());
    int links = 0;
    while (Cur().type == Tok::kOp) {
      bool match = false;
      for (auto o : ops) match = match || Cur().text == o;
      if (!match) break;
      STRATA_RETURN_IF_ERROR(Link(&links));
      ExprPtr b = Make(ExprKind::kBinary, Cur().line);
      b->name = Cur().text;
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr r, (this->*sub)());
      b->args.push_back(std::move(e));
      b->args.push_back(std::move(r));
      e = std::move(b);
    }
    return e;
  }
  absl::StatusOr<ExprPtr> Math1() { return Binary(&Parser::Concat, {"+", "-"}); }
  absl::StatusOr<ExprPtr> Concat() { return Binary(&Parser::Math2, {"~"}); }
  absl::StatusOr<ExprPtr> Math2() { return Binary(&Parser::Pow, {"*", "/", "//", "%"}); }
  absl::StatusOr<ExprPtr> Pow() { return Binary(&Parser::UnaryWithFilter, {"**"}); }
  absl::StatusOr<ExprPtr> UnaryWithFilter() { return Unary(true); }

  absl::StatusOr<ExprPtr> Unary(bool with_filter) {
    DepthGuard g(&depth_);
    if (depth_ > kMaxDepth) return Error("expressions nest deeper than " + std::to_string(kMaxDepth));
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? ExprKind::kNeg : ExprKind::kPos, Cur().line);
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr a, Unary(false));
      e->args.push_back(std::move(a));
    } else {
      STRATA_ASSIGN_OR_RETURN(e, Primary());
    }
    STRATA_ASSIGN_OR_RETURN(e, Postfix(std::move(e)));
    if (with_filter) {
      STRATA_ASSIGN_OR_RETURN(e, Filters(std::move(e), false));
    }
    return e;
  }

  absl::StatusOr<ExprPtr> Primary() {
    const Token &tk = Cur();
    const int line = tk.line;
    if (tk.type == Tok::kName) {
      ExprPtr e = Make(ExprKind::kLiteral, line);
      const std::string &n = tk.text;
      if (n == "true" || n == "True")
        e->literal = Value::Bool(true);
      else if (n == "false" || n == "False")
        e->literal = Value::Bool(false);
      else if (n == "none" || n == "None")
        e->literal = Value::None();
      else {
        e->kind = ExprKind::kName;
        e->name = n;
      }
      Next();
      return e;
    }
    if (tk.type == Tok::kString) {
      std::string s;
      while (Cur().type == Tok::kString) {
        s += Cur().text;
        Next();
      }
      ExprPtr e = Make(ExprKind::kLiteral, line);
      e->literal = Value::Str(std::move(s));
      return e;
    }
    if (tk.type == Tok::kInt) {
      ExprPtr e = Make(ExprKind::kLiteral, line);
      errno = 0;
      const long long v = std::strtoll(tk.text.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error("integer literal " + tk.text + " is out of range");
      e->literal = Value::Int(v);
      Next();
      return e;
    }
    if (tk.type == Tok::kFloat) {
      ExprPtr e = Make(ExprKind::kLiteral, line);
      e->literal = Value::Float(std::strtod(tk.text.c_str(), nullptr));
      Next();
      return e;
    }
    if (IsOp("(")) {
      Next();
      STRATA_ASSIGN_OR_RETURN(ExprPtr e, Tuple(true, true, {}));
      STRATA_RETURN_IF_ERROR(ExpectOp(")"));
      return e;
    }
    if (IsOp("[") || IsOp("{")) {
      const bool dict = IsOp("{");
      ExprPtr e = Make(dict ? ExprKind::kDict : ExprKind::kList, line);
      Next();
      const char *close = dict ? "}" : "]";
      while (!IsOp(close)) {
        if (!e->args.empty()) STRATA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(close)) break;
        STRATA_ASSIGN_OR_RETURN(ExprPtr item, Expression(true));
        e->args.push_back(std::move(item));
        if (dict) {
          STRATA_RETURN_IF_ERROR(ExpectOp(":"));
          STRATA_ASSIGN_OR_RETURN(ExprPtr value, Expression(true));
          e->args.push_back(std::move(value));
        }
      }
      Next();
      return e;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<ExprPtr> Postfix(ExprPtr e) {
    int links = 0;
    while (true) {
      if (IsOp(".") || IsOp("[") || IsOp("(")) STRATA_RETURN_IF_ERROR(Link(&links));
      if (IsOp(".")) {
        const int line = Cur().line;
        Next();
        if (Cur().type == Tok::kName) {
          ExprPtr a = Make(ExprKind::kAttr, line);
          a->name = Cur().text;
          Next();
          a->args.push_back(std::move(e));
          e = std::move(a);
        } else if (Cur().type == Tok::kInt) {
          ExprPtr a = Make(ExprKind::kItem, line);
          ExprPtr idx = Make(ExprKind::kLiteral, line);
          idx->literal = Value::Int(std::strtoll(Cur().text.c_str(), nullptr, 10));
          Next();
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
          e = std::move(a);
        } else {
          return Unexpected("an attribute name after '.'");
        }
      } else if (IsOp("[")) {
        STRATA_ASSIGN_OR_RETURN(e, Subscript(std::move(e)));
      } else if (IsOp("(")) {
        STRATA_ASSIGN_OR_RETURN(e, Call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> Subscript(ExprPtr target) {
    const int line = Cur().line;
    Next();  // [
    ExprPtr parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!IsOp(":") && !IsOp("]")) {
        STRATA_ASSIGN_OR_RETURN(parts[k], Expression(true));
      }
      if (!IsOp(":")) break;
      slice = true;
      Next();
      if (k == 2) return Unexpected("']'");
    }
    STRATA_RETURN_IF_ERROR(ExpectOp("]"));
    ExprPtr e = Make(slice ? ExprKind::kSlice : ExprKind::kItem, line);
    if (!slice && !parts[0]) return Error("empty subscript '[]'");
    e->args.push_back(std::move(target));
    e->args.push_back(std::move(parts[0]));
    if (slice) {
      e->args.push_back(std::move(parts[1]));
      e->args.push_back(std::move(parts[2]));
    }
    return e;
  }

  // (args, name=value) after a callee; appended to e->args / e->kwargs.
  absl::Status Args(Expr *e) {
    Next();  // (
    bool first = true;
    while (!IsOp(")")) {
      if (!first) STRATA_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        STRATA_ASSIGN_OR_RETURN(ExprPtr v, Expression(true));
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!e->kwargs.empty()) return Error("a positional argument follows a keyword argument");
        STRATA_ASSIGN_OR_RETURN(ExprPtr v, Expression(true));
        e->args.push_back(std::move(v));
      }
    }
    Next();
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> Call(ExprPtr callee) {
    ExprPtr c = Make(ExprKind::kCall, Cur().line);
    c->args.push_back(std::move(callee));
    STRATA_RETURN_IF_ERROR(Args(c.get()));
    return c;
  }

  absl::StatusOr<std::string> DottedName() {
    STRATA_ASSIGN_OR_RETURN(std::string n, Identifier());
    while (IsOp(".") && Peek().type == Tok::kName) {
      Next();
      n += "." + Cur().text;
      Next();
    }
    return n;
  }

  // | filter(args), is [not] test(args), (call): jinja2's parse_filter_expr.
  absl::StatusOr<ExprPtr> Filters(ExprPtr e, bool first_without_pipe) {
    int links = 0;
    while (true) {
      if (IsOp("|") || IsName("is") || IsOp("(") || first_without_pipe) STRATA_RETURN_IF_ERROR(Link(&links));
      if (IsOp("|") || first_without_pipe) {
        if (!first_without_pipe) Next();
        first_without_pipe = false;
        ExprPtr f = Make(ExprKind::kFilter, Cur().line);
        STRATA_ASSIGN_OR_RETURN(f->name, DottedName());
        f->args.push_back(std::move(e));
        if (IsOp("(")) STRATA_RETURN_IF_ERROR(Args(f.get()));
        e = std::move(f);
      } else if (IsName("is")) {
        ExprPtr t = Make(ExprKind::kTest, Cur().line);
        Next();
        if (IsName("not")) {
          t->negated = true;
          Next();
        }
        STRATA_ASSIGN_OR_RETURN(t->name, DottedName());
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          STRATA_RETURN_IF_ERROR(Args(t.get()));
        } else if ((Cur().type == Tok::kName || Cur().type == Tok::kString || Cur().type == Tok::kInt ||
                    Cur().type == Tok::kFloat || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return Error("tests cannot be chained with 'is'");
          STRATA_ASSIGN_OR_RETURN(ExprPtr arg, Primary());
          STRATA_ASSIGN_OR_RETURN(arg, Postfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        STRATA_ASSIGN_OR_RETURN(e, Call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Program>> Parse(std::string_view source) {
  STRATA_ASSIGN_OR_RETURN(std::vector<Token> toks, Lex(source));
  return Parser(std::move(toks)).Run();
}

}  // namespace strata::text::jinja
