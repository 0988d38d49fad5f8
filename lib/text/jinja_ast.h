// The Jinja engine's tokens and syntax tree, shared by the lexer (jinja_lexer.cc), the parser
// (jinja_parser.cc) and the evaluator (jinja_eval.cc). Every token and node carries its 1-based
// source line, which every error message names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lib/text/jinja_value.h"

namespace strata::text::jinja {

// --- Tokens ------------------------------------------------------------------------------------
enum class Tok : uint8_t {
  kText,        // template data between tags (whitespace control already applied)
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kVarBegin,    // {{
  kVarEnd,      // }}
  kName,
  kString,  // value already unescaped
  kInt,
  kFloat,
  kOp,  // an operator or punctuation: text holds it
  kEof,
};

struct Token {
  Tok type;
  std::string text;
  int line;
};

// Splits a template into tokens the way jinja2's lexer does with transformers' settings
// (trim_blocks, lstrip_blocks; newlines normalised to \n, one trailing newline dropped).
absl::StatusOr<std::vector<Token>> Lex(std::string_view source);

// --- Expressions -------------------------------------------------------------------------------
enum class ExprKind : uint8_t {
  kLiteral,  // literal
  kName,     // name
  kList,     // [args...]
  kTuple,    // (args...)
  kDict,     // {args[0]: args[1], ...}
  kAttr,     // args[0].name
  kItem,     // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts absent)
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs)
  kTest,     // args[0] is [not] name(args[1..])
  kNot,      // not args[0]
  kNeg,      // -args[0]
  kPos,      // +args[0]
  kBinary,   // args[0] name args[1]: + - * / // % ** ~
  kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...
  kAnd,
  kOr,
  kCond,  // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

// --- Statements --------------------------------------------------------------------------------
enum class NodeKind : uint8_t {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conds[k] -> branches[k]; a trailing branch without cond is else
  kFor,          // for targets in expr [if cond] body [else else_body]
  kSet,          // set targets (or targets[0].attr) = expr
  kSetBlock,     // set targets[0] %} body {% endset
  kMacro,        // macro name(targets, defaults) body
  kCallBlock,    // call(targets) expr %} body {% endcall: `caller` is the body
  kFilterBlock,  // filter expr(name, args) body
  kBreak,
  kContinue,
  kScope,  // body in its own frame ({% generation %} and {% with %} bodies)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;  // kText; kMacro: its name; kSet: the attribute of a namespace target
  ExprPtr expr;
  ExprPtr cond;  // kFor: the loop filter
  std::vector<ExprPtr> conds;
  std::vector<Body> branches;
  std::vector<std::string> targets;
  std::vector<ExprPtr> defaults;  // kMacro / kCallBlock: one per target, null when none
  Body body, else_body;
  bool uses_varargs = false;  // kMacro: its body reads `varargs` (then extra positional arguments are allowed)
  bool uses_kwargs = false;   // kMacro: its body reads `kwargs` (then unknown keyword arguments are allowed)
};

struct Program {
  Body body;
};

// Parses a template; errors name the line and what is wrong.
absl::StatusOr<std::shared_ptr<const Program>> Parse(std::string_view source);

}  // namespace strata::text::jinja
