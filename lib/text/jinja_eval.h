// The Jinja evaluator's interface to the built-ins (jinja_builtins.cc): scopes, output capture,
// limits, and the lookups of filters, tests, methods and globals by name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lib/text/jinja.h"
#include "lib/text/jinja_ast.h"
#include "lib/util/hash_containers.h"

namespace strata::text::jinja {

// One scope: the template's top level, a for-loop iteration, a macro call.
struct Frame {
  HashMap<std::string, Value> vars;
  Frame *parent = nullptr;
};

class Evaluator {
 public:
  Evaluator(const Value &context, const RenderLimits &limits) : context_(context), limits_(limits) {}

  absl::Status Run(const Program &program, Rendered *out);

  // Calls a callable value (macro, global, bound method).
  absl::StatusOr<Value> Call(const Value &fn, CallArgs &args);
  // Counts one step (a call, a loop iteration); MOE_ERR_LIMIT past the limit.
  absl::Status Step();
  // MOE_ERR_LIMIT when `n` bytes (or items) would pass the output limit.
  absl::Status CheckSize(size_t n) const;
  // MOE_ERR_LIMIT when a list of `n` items would pass the item limit.
  absl::Status CheckItems(size_t n) const;
  const RenderLimits &limits() const { return limits_; }
  // Remembers a namespace() so that Run can empty it at the end: a namespace may hold itself
  // ({% set ns.me = ns %}), a cycle its shared_ptr would never free.
  void Track(const Value &ns) { namespaces_.push_back(ns.dict); }
  ~Evaluator() {
    for (auto &d : namespaces_) d->items.clear();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  absl::StatusOr<Flow> ExecBody(const Body &body, Frame *frame);
  absl::StatusOr<Flow> Exec(const Node &n, Frame *frame);
  absl::StatusOr<Flow> ExecFor(const Node &n, Frame *frame);
  absl::Status ExecSet(const Node &n, Frame *frame);
  absl::StatusOr<Value> Eval(const Expr &e, Frame *frame);
  absl::StatusOr<Value> EvalInner(const Expr &e, Frame *frame);
  absl::StatusOr<Value> EvalCall(const Expr &e, Frame *frame);
  absl::Status EvalArgs(const Expr &e, size_t first, Frame *frame, CallArgs *args);
  absl::StatusOr<Value> CallMacro(const Node &macro, CallArgs &args, const Value *caller);
  absl::StatusOr<Value> Capture(const Body &body, Frame *frame);
  Value Lookup(const std::string &name, Frame *frame) const;
  absl::Status Emit(const Value &v);

  const Value &context_;
  const RenderLimits &limits_;
  Frame *root_ = nullptr;
  std::string *out_ = nullptr;
  std::vector<Span> *spans_ = nullptr;
  uint64_t steps_ = 0;
  int depth_ = 0;
  const Value *hole_ = nullptr;  // the body text a {% filter %} block filters
  std::vector<std::shared_ptr<Dict>> namespaces_;
};

// --- built-ins (jinja_builtins.cc) ---
bool IsFilter(std::string_view name);
bool IsTest(std::string_view name);
absl::StatusOr<Value> ApplyFilter(Evaluator &ev, std::string_view name, const Value &v, CallArgs &args);
absl::StatusOr<bool> ApplyTest(Evaluator &ev, std::string_view name, const Value &v, CallArgs &args);
// obj.name as jinja2's sandboxed getattr sees it: methods of str / dict / list, then items.
absl::StatusOr<Value> GetAttr(Evaluator &ev, const Value &obj, const std::string &name);
// obj[key]: items first, then attributes for a string key.
absl::StatusOr<Value> GetItem(Evaluator &ev, const Value &obj, const Value &key);
absl::StatusOr<Value> GetSlice(Evaluator &ev, const Value &obj, const Value &start, const Value &stop,
                               const Value &step);
// The global functions (range, namespace, dict, raise_exception, strftime_now); Undefined if none.
Value Global(std::string_view name);
// Python's binary operators + - * / // % ** ~ and comparisons < <= > >= in.
absl::StatusOr<Value> BinaryOp(Evaluator &ev, std::string_view op, const Value &a, const Value &b);
absl::StatusOr<bool> CompareOp(std::string_view op, const Value &a, const Value &b);
// The items a for loop visits: a list's, a dict's keys, a string's characters; none for Undefined.
absl::StatusOr<List> Iterate(const Value &v);
// A string built from `src`'s text: wholly the caller's if anything in src was.
Value Derived(const Value &src, std::string s);

// Helpers the filters share with the methods (jinja_builtins.cc).
namespace internal {
absl::Status Bad(std::string msg);
absl::Status UndefinedError(const Value &v);
std::string S(const Value &v);
std::string PyLower(std::string s);
std::string PyUpper(std::string s);
std::string JinjaTitle(const std::string &s);
std::string PyTitle(const std::string &s);
std::string Capitalize(const std::string &s);
bool IsAlpha(char c);  // ASCII letters (str.isalpha on ASCII)
// str.split(sep, maxsplit) (sep None: runs of whitespace), str.rsplit with a separator,
// str.splitlines().
std::vector<std::string> Split(const std::string &s, const Value &sep, int64_t maxsplit);
std::vector<std::string> RSplit(const std::string &s, const std::string &d, int64_t maxsplit);
std::vector<std::string> SplitLines(const std::string &s);
absl::StatusOr<std::string> Replace(const std::string &s, const std::string &from, const std::string &to, int64_t count,
                                    size_t cap);
int64_t Len(const Value &v);
absl::StatusOr<int64_t> ToIndex(const Value &v, const char *what);
absl::StatusOr<Value> PercentFormat(const Value &fmt, const Value &args);
absl::StatusOr<bool> Less(const Value &a, const Value &b);
Value Folded(const Value &v, bool case_sensitive);
absl::StatusOr<Value> AttrPath(Evaluator &ev, const Value &obj, const std::string &path);
absl::StatusOr<Value> ToJson(const Value &v, CallArgs &args, size_t cap);
absl::StatusOr<Value> Indent(const Value &v, CallArgs &args, size_t cap);
double PyRound(double x, int64_t digits);
}  // namespace internal

}  // namespace strata::text::jinja
