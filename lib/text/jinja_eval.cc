// The Jinja evaluator: runs a parsed template over a context with jinja2's scoping (a for-loop
// iteration and a macro call are scopes, if is not; namespace() objects carry values out of
// loops), its Undefined, and bounds on depth, steps, work inside operations and output size.
#include "lib/text/jinja_eval.h"

#include "nlohmann/json.hpp"

namespace strata::text::jinja {
namespace {

constexpr std::string_view kLinePrefix = "chat template line ";

absl::Status AtLine(const absl::Status &st, int line) {
  if (st.ok()) return st;
  const std::string msg(st.message());
  if (msg.compare(0, kLinePrefix.size(), kLinePrefix) == 0) return st;
  return MakeError(StatusToMoe(st), std::string(kLinePrefix) + std::to_string(line) + ": " + msg);
}

absl::Status ErrorAt(int line, const std::string &what) {
  return MakeError(MOE_ERR_INVALID_ARGUMENT, std::string(kLinePrefix) + std::to_string(line) + ": " + what);
}

struct DepthGuard {
  explicit DepthGuard(int *d) : d(d) { ++*d; }
  ~DepthGuard() { --*d; }
  int *d;
};

// Unknown filters and tests are errors when the template is parsed, as in jinja2.
absl::Status ValidateExpr(const Expr *e);
absl::Status ValidateBody(const Body &body);

absl::Status ValidateExpr(const Expr *e) {
  if (e == nullptr) return absl::OkStatus();
  if (e->kind == ExprKind::kFilter && !IsFilter(e->name)) return ErrorAt(e->line, "unknown filter '" + e->name + "'");
  if (e->kind == ExprKind::kTest && !IsTest(e->name)) return ErrorAt(e->line, "unknown test '" + e->name + "'");
  for (const auto &a : e->args) STRATA_RETURN_IF_ERROR(ValidateExpr(a.get()));
  for (const auto &kv : e->kwargs) STRATA_RETURN_IF_ERROR(ValidateExpr(kv.second.get()));
  return absl::OkStatus();
}

absl::Status ValidateBody(const Body &body) {
  for (const auto &n : body) {
    STRATA_RETURN_IF_ERROR(ValidateExpr(n->expr.get()));
    STRATA_RETURN_IF_ERROR(ValidateExpr(n->cond.get()));
    for (const auto &c : n->conds) STRATA_RETURN_IF_ERROR(ValidateExpr(c.get()));
    for (const auto &d : n->defaults) STRATA_RETURN_IF_ERROR(ValidateExpr(d.get()));
    for (const auto &b : n->branches) STRATA_RETURN_IF_ERROR(ValidateBody(b));
    STRATA_RETURN_IF_ERROR(ValidateBody(n->body));
    STRATA_RETURN_IF_ERROR(ValidateBody(n->else_body));
  }
  return absl::OkStatus();
}

// The literal a {% filter %} block's chain starts from (jinja_parser.cc names it so): it stands
// for the block's rendered text.
constexpr const char *kHole = "\x01hole";

}  // namespace

absl::Status Evaluator::Step() {
  if (++steps_ > limits_.max_steps) {
    return MakeError(MOE_ERR_LIMIT, "rendering took more than " + std::to_string(limits_.max_steps) + " steps");
  }
  if (work::Exhausted()) {
    return MakeError(MOE_ERR_LIMIT, "rendering did more than " + std::to_string(limits_.max_work) +
                                        " units of work inside operations (comparisons, string scans)");
  }
  return absl::OkStatus();
}

absl::Status Evaluator::CheckSize(size_t n) const {
  if (n > limits_.max_output) {
    return MakeError(MOE_ERR_LIMIT,
                     "a rendered text or value would pass " + std::to_string(limits_.max_output) + " bytes (items)");
  }
  return absl::OkStatus();
}

absl::Status Evaluator::CheckItems(size_t n) const {
  if (n > limits_.max_items) {
    return MakeError(MOE_ERR_LIMIT, "a list would pass " + std::to_string(limits_.max_items) + " items");
  }
  return absl::OkStatus();
}

absl::Status Evaluator::Run(const Program &program, Rendered *out) {
  work::Start(limits_.max_work);
  Frame root;
  root_ = &root;
  out_ = &out->text;
  spans_ = &out->caller_spans;
  STRATA_ASSIGN_OR_RETURN(Flow f, ExecBody(program.body, &root));
  (void)f;
  return absl::OkStatus();
}

Value Evaluator::Lookup(const std::string &name, Frame *frame) const {
  for (Frame *f = frame; f != nullptr; f = f->parent) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  if (context_.is_mapping()) {
    if (const Value *v = context_.dict->Find(name)) return *v;
  }
  Value g = Global(name);
  if (!g.is_undefined()) return g;
  return Value::Undefined("'" + name + "' is undefined");
}

absl::Status Evaluator::Emit(const Value &v) {
  AppendStr(v, out_, spans_, limits_.max_output);
  return CheckSize(out_->size());
}

absl::StatusOr<Value> Evaluator::Capture(const Body &body, Frame *frame) {
  Value s = Value::Str("");
  std::string *saved_out = out_;
  std::vector<Span> *saved_spans = spans_;
  out_ = &s.str;
  spans_ = &s.spans;
  absl::StatusOr<Flow> f = ExecBody(body, frame);
  out_ = saved_out;
  spans_ = saved_spans;
  if (!f.ok()) return f.status();
  return s;
}

absl::StatusOr<Evaluator::Flow> Evaluator::ExecBody(const Body &body, Frame *frame) {
  DepthGuard g(&depth_);
  if (depth_ > limits_.max_depth) {
    return MakeError(MOE_ERR_LIMIT, "rendering nests deeper than " + std::to_string(limits_.max_depth));
  }
  for (const auto &n : body) {
    STRATA_ASSIGN_OR_RETURN(Flow f, Exec(*n, frame));
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

absl::StatusOr<Evaluator::Flow> Evaluator::Exec(const Node &n, Frame *frame) {
  STRATA_RETURN_IF_ERROR(AtLine(Step(), n.line));
  switch (n.kind) {
    case NodeKind::kText:
      out_->append(n.text);
      STRATA_RETURN_IF_ERROR(AtLine(CheckSize(out_->size()), n.line));
      return Flow::kNormal;
    case NodeKind::kOutput: {
      STRATA_ASSIGN_OR_RETURN(Value v, Eval(*n.expr, frame));
      STRATA_RETURN_IF_ERROR(AtLine(Emit(v), n.line));
      return Flow::kNormal;
    }
    case NodeKind::kIf:
      for (size_t k = 0; k < n.branches.size(); ++k) {
        if (k < n.conds.size()) {
          STRATA_ASSIGN_OR_RETURN(Value c, Eval(*n.conds[k], frame));
          if (!Truthy(c)) continue;
        }
        return ExecBody(n.branches[k], frame);
      }
      return Flow::kNormal;
    case NodeKind::kFor:
      return ExecFor(n, frame);
    case NodeKind::kSet:
      STRATA_RETURN_IF_ERROR(ExecSet(n, frame));
      return Flow::kNormal;
    case NodeKind::kSetBlock: {
      STRATA_ASSIGN_OR_RETURN(Value s, Capture(n.body, frame));
      frame->vars[n.targets[0]] = std::move(s);
      return Flow::kNormal;
    }
    case NodeKind::kMacro: {
      const Node *macro = &n;
      frame->vars[n.text] =
          Value::Fn(n.text, [macro](Evaluator &ev, CallArgs &args) { return ev.CallMacro(*macro, args, nullptr); });
      return Flow::kNormal;
    }
    case NodeKind::kCallBlock: {
      // `caller()` renders the block's body in the scope where the block stands.
      const Node *block = &n;
      // `caller` points into this block's frame: calling it after the block ended is refused.
      auto alive = std::make_shared<bool>(true);
      Value caller =
          Value::Fn("caller", [this, block, frame, alive](Evaluator &ev, CallArgs &args) -> absl::StatusOr<Value> {
            if (!*alive) return MakeError(MOE_ERR_INVALID_ARGUMENT, "caller() used after its {% call %} block ended");
            Frame f;
            f.parent = frame;
            for (size_t k = 0; k < block->targets.size(); ++k) {
              Value v = args.Get(k, block->targets[k]);
              if (v.is_undefined() && block->defaults[k]) {
                STRATA_ASSIGN_OR_RETURN(v, Eval(*block->defaults[k], &f));
              }
              f.vars[block->targets[k]] = std::move(v);
            }
            return Capture(block->body, &f);
          });
      const Expr &call = *n.expr;
      STRATA_ASSIGN_OR_RETURN(Value fn, Eval(*call.args[0], frame));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(EvalArgs(call, 1, frame, &args));
      args.kw.emplace_back("caller", caller);
      absl::StatusOr<Value> called = Call(fn, args);
      *alive = false;
      STRATA_ASSIGN_OR_RETURN(Value r, std::move(called));
      STRATA_RETURN_IF_ERROR(AtLine(Emit(r), n.line));
      return Flow::kNormal;
    }
    case NodeKind::kFilterBlock: {
      STRATA_ASSIGN_OR_RETURN(Value body, Capture(n.body, frame));
      const Value *saved = hole_;
      hole_ = &body;
      absl::StatusOr<Value> r = Eval(*n.expr, frame);
      hole_ = saved;
      if (!r.ok()) return r.status();
      STRATA_RETURN_IF_ERROR(AtLine(Emit(*r), n.line));
      return Flow::kNormal;
    }
    case NodeKind::kBreak:
      return Flow::kBreak;
    case NodeKind::kContinue:
      return Flow::kContinue;
    case NodeKind::kScope: {
      Frame f;
      f.parent = frame;
      STRATA_ASSIGN_OR_RETURN(Flow fl, ExecBody(n.body, &f));
      return fl;
    }
  }
  return Flow::kNormal;
}

namespace {

absl::Status Unpack(const std::vector<std::string> &targets, const Value &v, Frame *f, int line) {
  if (targets.size() == 1) {
    f->vars[targets[0]] = v;
    return absl::OkStatus();
  }
  absl::StatusOr<List> items = Iterate(v);
  if (!items.ok()) return AtLine(items.status(), line);
  if (v.is_undefined() || items->size() != targets.size()) {
    return ErrorAt(line, "cannot unpack " + TypeName(v) + " into " + std::to_string(targets.size()) + " names");
  }
  for (size_t k = 0; k < targets.size(); ++k) f->vars[targets[k]] = (*items)[k];
  return absl::OkStatus();
}

}  // namespace

absl::Status Evaluator::ExecSet(const Node &n, Frame *frame) {
  STRATA_ASSIGN_OR_RETURN(Value v, Eval(*n.expr, frame));
  if (!n.text.empty()) {
    Value ns = Lookup(n.targets[0], frame);
    if (ns.kind != Kind::kNamespace) {
      return ErrorAt(n.line, "cannot assign attribute '" + n.text + "' on " + TypeName(ns) + " '" + n.targets[0] +
                                 "' (only on a namespace())");
    }
    ns.dict->Set(Value::Str(n.text), std::move(v));
    return absl::OkStatus();
  }
  return Unpack(n.targets, v, frame, n.line);
}

absl::StatusOr<Evaluator::Flow> Evaluator::ExecFor(const Node &n, Frame *frame) {
  STRATA_ASSIGN_OR_RETURN(Value seq, Eval(*n.expr, frame));
  absl::StatusOr<List> all = Iterate(seq);
  if (!all.ok()) return AtLine(all.status(), n.line);
  List items;
  if (n.cond) {
    for (const Value &item : *all) {
      STRATA_RETURN_IF_ERROR(AtLine(Step(), n.line));
      Frame f;
      f.parent = frame;
      STRATA_RETURN_IF_ERROR(Unpack(n.targets, item, &f, n.line));
      STRATA_ASSIGN_OR_RETURN(Value keep, Eval(*n.cond, &f));
      if (Truthy(keep)) items.push_back(item);
    }
  } else {
    items = std::move(*all);
  }
  if (items.empty()) {
    if (n.else_body.empty()) return Flow::kNormal;
    STRATA_ASSIGN_OR_RETURN(Flow fl, ExecBody(n.else_body, frame));
    return fl;
  }
  const int64_t len = static_cast<int64_t>(items.size());
  const int64_t depth = 1;  // loop.depth grows only in recursive loops, which are not supported
  for (int64_t k = 0; k < len; ++k) {
    STRATA_RETURN_IF_ERROR(AtLine(Step(), n.line));
    Frame f;
    f.parent = frame;
    STRATA_RETURN_IF_ERROR(Unpack(n.targets, items[k], &f, n.line));
    Value loop = Value::MakeDict();
    loop.Set(Value::Str("index"), Value::Int(k + 1));
    loop.Set(Value::Str("index0"), Value::Int(k));
    loop.Set(Value::Str("revindex"), Value::Int(len - k));
    loop.Set(Value::Str("revindex0"), Value::Int(len - k - 1));
    loop.Set(Value::Str("first"), Value::Bool(k == 0));
    loop.Set(Value::Str("last"), Value::Bool(k == len - 1));
    loop.Set(Value::Str("length"), Value::Int(len));
    loop.Set(Value::Str("depth"), Value::Int(depth));
    loop.Set(Value::Str("depth0"), Value::Int(depth - 1));
    loop.Set(Value::Str("previtem"), k > 0 ? items[k - 1] : Value::Undefined("there is no previous item"));
    loop.Set(Value::Str("nextitem"), k + 1 < len ? items[k + 1] : Value::Undefined("there is no next item"));
    loop.Set(Value::Str("cycle"), Value::Fn("loop.cycle", [k](Evaluator &, CallArgs &args) -> absl::StatusOr<Value> {
               if (args.pos.empty()) return MakeError(MOE_ERR_INVALID_ARGUMENT, "loop.cycle() needs at least one item");
               return args.pos[static_cast<size_t>(k) % args.pos.size()];
             }));
    f.vars["loop"] = std::move(loop);
    STRATA_ASSIGN_OR_RETURN(Flow fl, ExecBody(n.body, &f));
    if (fl == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::StatusOr<Value> Evaluator::CallMacro(const Node &macro, CallArgs &args, const Value *caller) {
  DepthGuard g(&depth_);
  if (depth_ > limits_.max_depth) {
    return MakeError(MOE_ERR_LIMIT, "macro calls nest deeper than " + std::to_string(limits_.max_depth));
  }
  Frame f;
  f.parent = root_;
  const size_t n = macro.targets.size();
  if (args.pos.size() > n && !macro.uses_varargs) {
    return MakeError(MOE_ERR_INVALID_ARGUMENT,
                     "macro '" + macro.text + "' takes not more than " + std::to_string(n) + " argument(s)");
  }
  for (const auto &kv : args.kw) {
    bool is_param = kv.first == "caller";
    for (const auto &t : macro.targets) is_param = is_param || t == kv.first;
    if (!is_param && !macro.uses_kwargs) {
      return MakeError(MOE_ERR_INVALID_ARGUMENT,
                       "macro '" + macro.text + "' takes no keyword argument '" + kv.first + "'");
    }
  }
  List varargs;
  for (size_t k = n; k < args.pos.size(); ++k) varargs.push_back(args.pos[k]);
  Value kwargs = Value::MakeDict();
  for (auto &kv : args.kw) {
    bool is_param = false;
    for (const auto &t : macro.targets) is_param = is_param || t == kv.first;
    if (!is_param && kv.first != "caller") kwargs.Set(Value::Str(kv.first), kv.second);
    if (kv.first == "caller") f.vars["caller"] = kv.second;
  }
  for (size_t k = 0; k < n; ++k) {
    Value v = args.Get(k, macro.targets[k], Value::Undefined("parameter '" + macro.targets[k] + "' was not provided"));
    if (!args.Has(k, macro.targets[k]) && macro.defaults[k]) {
      STRATA_ASSIGN_OR_RETURN(v, Eval(*macro.defaults[k], &f));
    }
    f.vars[macro.targets[k]] = std::move(v);
  }
  f.vars["varargs"] = Value::MakeList(std::move(varargs), /*tuple=*/true);
  f.vars["kwargs"] = std::move(kwargs);
  if (caller != nullptr) f.vars["caller"] = *caller;
  return Capture(macro.body, &f);
}

absl::StatusOr<Value> Evaluator::Call(const Value &fn, CallArgs &args) {
  STRATA_RETURN_IF_ERROR(Step());
  if (fn.kind != Kind::kCallable) {
    if (fn.is_undefined())
      return MakeError(MOE_ERR_INVALID_ARGUMENT, fn.str.empty() ? "undefined is not callable" : fn.str);
    return MakeError(MOE_ERR_INVALID_ARGUMENT, "'" + TypeName(fn) + "' is not callable");
  }
  return (*fn.fn)(*this, args);
}

absl::Status Evaluator::EvalArgs(const Expr &e, size_t first, Frame *frame, CallArgs *args) {
  for (size_t k = first; k < e.args.size(); ++k) {
    STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k], frame));
    args->pos.push_back(std::move(v));
  }
  for (const auto &kv : e.kwargs) {
    STRATA_ASSIGN_OR_RETURN(Value v, Eval(*kv.second, frame));
    args->kw.emplace_back(kv.first, std::move(v));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Evaluator::Eval(const Expr &e, Frame *frame) {
  DepthGuard g(&depth_);
  if (depth_ > limits_.max_depth) {
    return MakeError(MOE_ERR_LIMIT, std::string(kLinePrefix) + std::to_string(e.line) +
                                        ": evaluation nests deeper than " + std::to_string(limits_.max_depth));
  }
  if (work::Exhausted()) return AtLine(Step(), e.line);
  absl::StatusOr<Value> r = EvalInner(e, frame);
  if (!r.ok()) return AtLine(r.status(), e.line);
  if (r->depth > kMaxNesting) {
    return MakeError(MOE_ERR_LIMIT, std::string(kLinePrefix) + std::to_string(e.line) + ": values nest deeper than " +
                                        std::to_string(kMaxNesting));
  }
  return r;
}

absl::StatusOr<Value> Evaluator::EvalInner(const Expr &e, Frame *frame) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      if (hole_ != nullptr && e.name == kHole) return *hole_;
      return e.literal;
    case ExprKind::kName:
      return Lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      for (const auto &a : e.args) {
        STRATA_ASSIGN_OR_RETURN(Value v, Eval(*a, frame));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      Value d = Value::MakeDict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        STRATA_ASSIGN_OR_RETURN(Value key, Eval(*e.args[k], frame));
        STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[k + 1], frame));
        if (key.is_list() || key.is_mapping() || key.is_undefined()) {
          return MakeError(MOE_ERR_INVALID_ARGUMENT, "unhashable type: '" + TypeName(key) + "'");
        }
        d.Set(std::move(key), std::move(v));
      }
      return d;
    }
    case ExprKind::kAttr: {
      STRATA_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      return GetAttr(*this, obj, e.name);
    }
    case ExprKind::kItem: {
      STRATA_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      STRATA_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], frame));
      return GetItem(*this, obj, key);
    }
    case ExprKind::kSlice: {
      STRATA_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      Value parts[3] = {Value::None(), Value::None(), Value::None()};
      for (int k = 0; k < 3; ++k) {
        if (e.args[k + 1]) {
          STRATA_ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1], frame));
        }
      }
      return GetSlice(*this, obj, parts[0], parts[1], parts[2]);
    }
    case ExprKind::kCall:
      return EvalCall(e, frame);
    case ExprKind::kFilter: {
      STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(EvalArgs(e, 1, frame, &args));
      return ApplyFilter(*this, e.name, v, args);
    }
    case ExprKind::kTest: {
      STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      CallArgs args;
      STRATA_RETURN_IF_ERROR(EvalArgs(e, 1, frame, &args));
      STRATA_ASSIGN_OR_RETURN(bool r, ApplyTest(*this, e.name, v, args));
      return Value::Bool(r != e.negated);
    }
    case ExprKind::kNot: {
      STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      return Value::Bool(!Truthy(v));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      STRATA_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      if (v.is_undefined()) return MakeError(MOE_ERR_INVALID_ARGUMENT, v.str.empty() ? "undefined value" : v.str);
      if (!v.is_number()) {
        return MakeError(MOE_ERR_INVALID_ARGUMENT, std::string("bad operand type for unary ") +
                                                       (e.kind == ExprKind::kNeg ? "-" : "+") + ": '" + TypeName(v) +
                                                       "'");
      }
      if (e.kind == ExprKind::kPos) return v.kind == Kind::kBool ? Value::Int(v.i) : v;
      if (v.kind == Kind::kFloat) return Value::Float(-v.f);
      if (v.i == INT64_MIN) return MakeError(MOE_ERR_INVALID_ARGUMENT, "integer overflow");
      return Value::Int(-v.i);
    }
    case ExprKind::kBinary: {
      STRATA_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
      STRATA_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], frame));
      return BinaryOp(*this, e.name, a, b);
    }
    case ExprKind::kCompare: {
      STRATA_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], frame));
      for (size_t k = 0; k < e.ops.size(); ++k) {
        STRATA_ASSIGN_OR_RETURN(Value right, Eval(*e.args[k + 1], frame));
        STRATA_ASSIGN_OR_RETURN(bool r, CompareOp(e.ops[k], left, right));
        if (!r) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      STRATA_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
      if (Truthy(a) == (e.kind == ExprKind::kOr)) return a;
      return Eval(*e.args[1], frame);
    }
    case ExprKind::kCond: {
      STRATA_ASSIGN_OR_RETURN(Value c, Eval(*e.args[1], frame));
      if (Truthy(c)) return Eval(*e.args[0], frame);
      if (e.args[2]) return Eval(*e.args[2], frame);
      return Value::Undefined("the condition was false and there is no else");
    }
  }
  return MakeError(MOE_ERR_INTERNAL, "unknown expression");
}

absl::StatusOr<Value> Evaluator::EvalCall(const Expr &e, Frame *frame) {
  STRATA_ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0], frame));
  CallArgs args;
  STRATA_RETURN_IF_ERROR(EvalArgs(e, 1, frame, &args));
  return Call(fn, args);
}

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const Program> p, jinja::Parse(source));
  STRATA_RETURN_IF_ERROR(ValidateBody(p->body));
  return Template(std::move(p));
}

absl::StatusOr<Rendered> Template::Render(const Value &context, const RenderLimits &limits) const {
  Rendered out;
  Evaluator ev(context, limits);
  STRATA_RETURN_IF_ERROR(ev.Run(*program_, &out));
  return out;
}

Value FromJson(const nlohmann::ordered_json &j, bool caller) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::Float(static_cast<double>(u))
                                                  : Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return caller ? Value::CallerStr(j.get<std::string>()) : Value::Str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto &x : j) items.push_back(FromJson(x, caller));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::MakeDict();
      for (auto it = j.begin(); it != j.end(); ++it) d.Set(Value::Str(it.key()), FromJson(it.value(), caller));
      return d;
    }
    default:
      return Value::None();
  }
}

}  // namespace strata::text::jinja
