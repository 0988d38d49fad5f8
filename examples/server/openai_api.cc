// Request checking and response writing for OpenAI's completions and chat completions. Fields the
// sampler has map onto it; fields Strata cannot honour (logit_bias, tools, echo, suffix, a JSON
// response format) are refused with a 400 naming them, never ignored.
// Unknown fields are ignored, as OpenAI's clients send optional extras.
#include "examples/server/openai_api.h"

#include <ctime>
#include <random>

#include "lib/format/json.h"

namespace strata::server {

using nlohmann::json;

namespace {

constexpr int kMaxStops = 4;           // OpenAI's limit
constexpr size_t kMaxStopBytes = 256;  // per stop string
constexpr int kMaxTopLogprobs = 20;

ApiError Bad(const std::string &param, const std::string &message, const std::string &code = "invalid_value") {
  ApiError e;
  e.message = message;
  e.param = param;
  e.code = code;
  return e;
}

std::string TypeName(const json &v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a number with a fraction";
    default: return "a number";
  }
}

// Optional fields: absent or null leave *out as it is. Each returns the error for a field of the
// wrong type or out of range.
std::optional<ApiError> GetNumber(const json &b, const char *key, double lo, double hi, float *out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(key, std::string("'") + key + "' must be a number, not " + TypeName(*it), "invalid_type");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return Bad(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " +
                        format::JsonExcerpt(*it));
  }
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json &b, const char *key, int64_t lo, int64_t hi, int64_t *out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    return Bad(key, std::string("'") + key + "' must be an integer, not " + TypeName(*it), "invalid_type");
  }
  // The parser stores a non-negative integer as unsigned: compare it as one, against both bounds.
  const bool in_range =
      it->is_number_unsigned()
          ? it->get<uint64_t>() <= static_cast<uint64_t>(hi) && (lo <= 0 || it->get<uint64_t>() >= static_cast<uint64_t>(lo))
          : it->get<int64_t>() >= lo && it->get<int64_t>() <= hi;
  if (!in_range) {
    return Bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], got " + format::JsonExcerpt(*it));
  }
  *out = it->is_number_unsigned() ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json &b, const char *key, bool *out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Bad(key, std::string("'") + key + "' must be a boolean, not " + TypeName(*it), "invalid_type");
  *out = it->get<bool>();
  return std::nullopt;
}

// Tokens of text (a user's: special tokens stay text); BOS where the model asks for it, as `strata run`.
std::optional<ApiError> TokenizePrompt(const ModelInfo &m, const std::string &text, std::vector<int32_t> *ids) {
  size_t n = 0;
  moe_status st = moe_tokenize(m.ctx, text.data(), text.size(), MOE_TOKENIZE_ADD_BOS, nullptr, 0, &n);
  if (st == MOE_ERR_LIMIT || (st == MOE_OK && n > 0)) {
    ids->resize(n);
    st = moe_tokenize(m.ctx, text.data(), text.size(), MOE_TOKENIZE_ADD_BOS, ids->data(), n, &n);
  }
  if (st != MOE_OK) {
    ApiError e = Bad("prompt", std::string("cannot tokenize the prompt: ") + moe_last_error(), "tokenizer_error");
    if (MOE_STATUS_CATEGORY(st) == MOE_ERR_UNSUPPORTED) e.message = "the model carries no tokenizer: give the prompt as token ids";
    return e;
  }
  return std::nullopt;
}

std::optional<ApiError> CheckIds(const ModelInfo &m, const json &arr, std::vector<int32_t> *ids) {
  for (const auto &t : arr) {
    const bool id = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(m.n_vocab)
                                           : t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < m.n_vocab;
    if (!id) {
      return Bad("prompt", "a prompt of token ids holds " + format::JsonExcerpt(t) + ", not a token id in [0, " +
                               std::to_string(m.n_vocab) + ")");
    }
    ids->push_back(t.get<int32_t>());
  }
  return std::nullopt;
}

// The prompts of /v1/completions: a string, token ids, or an array of either (one choice group each).
std::optional<ApiError> CompletionPrompts(const json &b, const ModelInfo &m, std::vector<std::vector<int32_t>> *out) {
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return Bad("prompt", "'prompt' is required", "missing_required_parameter");
  auto one = [&](const json &p) -> std::optional<ApiError> {
    std::vector<int32_t> ids;
    if (p.is_string()) {
      if (auto e = TokenizePrompt(m, p.get<std::string>(), &ids)) return e;
    } else if (p.is_array() && (p.empty() || p[0].is_number())) {
      if (auto e = CheckIds(m, p, &ids)) return e;
    } else {
      return Bad("prompt", "'prompt' must be a string, an array of token ids, or an array of those, not " +
                               TypeName(p), "invalid_type");
    }
    if (ids.empty()) return Bad("prompt", "the prompt has no tokens");
    out->push_back(std::move(ids));
    return std::nullopt;
  };
  if (it->is_array() && !it->empty() && (it->at(0).is_string() || it->at(0).is_array())) {
    for (const auto &p : *it) {
      if (auto e = one(p)) return e;
    }
    return std::nullopt;
  }
  return one(*it);
}

// The conversation of /v1/chat/completions through the model's template, rendered safely.
std::optional<ApiError> ChatPrompt(const json &b, const ModelInfo &m, std::vector<int32_t> *ids) {
  auto it = b.find("messages");
  if (it == b.end() || it->is_null()) return Bad("messages", "'messages' is required", "missing_required_parameter");
  if (!it->is_array() || it->empty()) return Bad("messages", "'messages' must be a non-empty array of messages");
  if (m.chat_template.empty()) {
    ApiError e = Bad("messages", "this model has no chat template Strata renders (" + m.template_error +
                                     "); start the server with --template NAME, or use /v1/completions");
    return e;
  }
  std::vector<std::string> roles, contents;
  for (size_t i = 0; i < it->size(); ++i) {
    const json &msg = it->at(i);
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) return Bad(where, where + " must be an object, not " + TypeName(msg), "invalid_type");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) return Bad(where + ".role", where + " needs a string 'role'", "invalid_type");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer") {
      return Bad(where + ".role", where + ".role '" + r + "' is not one of system, user, assistant, developer");
    }
    std::string text;
    auto content = msg.find("content");
    if (content == msg.end() || content->is_null()) {
      if (r != "assistant") return Bad(where + ".content", where + " needs 'content'", "missing_required_parameter");
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (const auto &part : *content) {  // text parts only
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || *type != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Bad(where + ".content", where + ".content may hold only {\"type\": \"text\", \"text\": ...} parts");
        }
        text += part["text"].get<std::string>();
      }
    } else {
      return Bad(where + ".content", where + ".content must be a string or an array of text parts, not " +
                                         TypeName(*content), "invalid_type");
    }
    if (text.find('\0') != std::string::npos) return Bad(where + ".content", where + ".content holds a NUL character");
    roles.push_back(r);
    contents.push_back(std::move(text));
  }
  std::vector<moe_chat_message> msgs;
  for (size_t i = 0; i < roles.size(); ++i) msgs.push_back({roles[i].c_str(), contents[i].c_str()});
  size_t n = 0;
  const char *tmpl = m.chat_template.c_str();
  moe_status st = moe_chat_tokenize(m.ctx, tmpl, msgs.data(), msgs.size(), 1, nullptr, 0, &n);
  if (st == MOE_ERR_LIMIT || (st == MOE_OK && n > 0)) {
    ids->resize(n);
    st = moe_chat_tokenize(m.ctx, tmpl, msgs.data(), msgs.size(), 1, ids->data(), n, &n);
  }
  if (st != MOE_OK) return Bad("messages", std::string("the chat template refuses the messages: ") + moe_last_error());
  if (ids->empty()) return Bad("messages", "the conversation has no tokens");
  return std::nullopt;
}

std::optional<ApiError> Refuse(const json &b) {
  auto nonempty = [&](const char *k) {
    auto it = b.find(k);
    return it != b.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>()) &&
           !((it->is_object() || it->is_array() || it->is_string()) && it->empty());
  };
  for (const char *k : {"logit_bias", "tools", "functions", "suffix", "echo"}) {
    if (nonempty(k)) return Bad(k, std::string("'") + k + "' is not supported by this server", "unsupported_parameter");
  }
  if (auto it = b.find("tool_choice"); it != b.end() && !it->is_null() && *it != "none" && *it != "auto") {
    return Bad("tool_choice", "'tool_choice' is not supported by this server", "unsupported_parameter");
  }
  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object() || it->value("type", json("text")) != "text") {
      return Bad("response_format", "only the 'text' response format is supported", "unsupported_parameter");
    }
  }
  return std::nullopt;
}

}  // namespace

json ErrorJson(const ApiError &e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string Dump(const json &j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::optional<ApiError> ParseBody(std::string_view text, json *out) {
  absl::StatusOr<json> j = format::ParseJson(text, MOE_ERR_INVALID_ARGUMENT, "the body");
  if (!j.ok()) {
    ApiError e = Bad("", std::string(j.status().message()) + " (a body must be one JSON object, UTF-8)", "invalid_json");
    return e;
  }
  *out = std::move(*j);
  return std::nullopt;
}

std::optional<ApiError> ParseRequest(const json &b, bool chat, const ModelInfo &m, Request *out) {
  if (!b.is_object()) return Bad("", "the body must be a JSON object, not " + TypeName(b), "invalid_type");
  if (auto it = b.find("model"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", "'model' must be a string, not " + TypeName(*it), "invalid_type");
    if (it->get<std::string>() != m.id) {
      ApiError e = Bad("model", "the model '" + it->get<std::string>() + "' does not exist; this server has '" + m.id + "'",
                       "model_not_found");
      e.status = 404;
      return e;
    }
  }
  if (auto e = Refuse(b)) return e;
  auto job = std::make_shared<Job>();
  Sampling &s = job->sampling;
  s = m.defaults;
  out->chat = chat;
  if (auto e = GetBool(b, "stream", &out->stream)) return e;
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "'stream_options' must be an object", "invalid_type");
    if (!out->stream) return Bad("stream_options", "'stream_options' is only allowed with stream: true");
    if (auto e = GetBool(*it, "include_usage", &out->include_usage)) return e;
  }
  if (auto e = GetNumber(b, "temperature", 0, 2, &s.temperature)) return e;
  if (auto e = GetNumber(b, "top_p", 0, 1, &s.top_p)) return e;
  if (b.contains("top_p") && b["top_p"].is_number() && !(s.top_p > 0)) return Bad("top_p", "'top_p' must be above 0");
  if (auto e = GetNumber(b, "min_p", 0, 1, &s.min_p)) return e;
  if (auto e = GetNumber(b, "presence_penalty", -2, 2, &s.presence_penalty)) return e;
  if (auto e = GetNumber(b, "frequency_penalty", -2, 2, &s.frequency_penalty)) return e;
  int64_t v = s.top_k;
  if (auto e = GetInt(b, "top_k", -1, 1 << 24, &v)) return e;
  s.top_k = v < 0 ? 0 : static_cast<int32_t>(v);  // -1 (vLLM's spelling) or 0: off
  v = static_cast<int64_t>(s.seed);
  if (auto e = GetInt(b, "seed", INT64_MIN, INT64_MAX, &v)) return e;
  s.seed = static_cast<uint64_t>(v);
  v = 1;
  if (auto e = GetInt(b, "n", 1, 128, &v)) return e;
  if (v > m.parallel) {
    return Bad("n", "'n' is " + std::to_string(v) + ", more than the " + std::to_string(m.parallel) +
                        " sessions this server runs at once (--parallel)");
  }
  job->n = static_cast<int>(v);
  // max_tokens (max_completion_tokens is the chat API's newer name).
  int64_t max_tokens = -1;
  const char *max_key = chat && b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null()
                            ? "max_completion_tokens" : "max_tokens";
  // With a context shift the context makes room as it fills: a reply may be longer than n_ctx.
  if (auto e = GetInt(b, max_key, 1, m.context_shift ? int64_t{1} << 30 : m.n_ctx, &max_tokens)) {
    if (e->code == "invalid_value" && !m.context_shift) {
      e->message += " (the context holds " + std::to_string(m.n_ctx) + " tokens)";
    }
    return e;
  }
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    std::vector<std::string> stops;
    if (it->is_string()) {
      stops.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= kMaxStops) {
      for (const auto &x : *it) {
        if (!x.is_string()) return Bad("stop", "'stop' must hold strings, not " + TypeName(x), "invalid_type");
        stops.push_back(x.get<std::string>());
      }
    } else {
      return Bad("stop", "'stop' must be a string or an array of at most 4 strings", "invalid_type");
    }
    for (const auto &x : stops) {
      if (x.size() > kMaxStopBytes) return Bad("stop", "a stop string is longer than 256 bytes");
      if (x.find('\0') != std::string::npos) return Bad("stop", "a stop string holds a NUL character");
      if (!x.empty()) s.stop.push_back(x);
    }
  }
  // logprobs: the chat's is a boolean with top_logprobs beside it; the completions' an integer.
  if (chat) {
    if (auto e = GetBool(b, "logprobs", &out->want_logprobs)) return e;
    int64_t top = 0;
    if (auto e = GetInt(b, "top_logprobs", 0, kMaxTopLogprobs, &top)) return e;
    if (b.contains("top_logprobs") && !b["top_logprobs"].is_null() && !out->want_logprobs) {
      return Bad("top_logprobs", "'top_logprobs' needs logprobs: true");
    }
    job->logprobs = out->want_logprobs ? static_cast<int>(top) : -1;
  } else {
    int64_t k = -1;
    if (auto it = b.find("logprobs"); it != b.end() && it->is_boolean()) {
      return Bad("logprobs", "'logprobs' of a completion is an integer (how many alternatives), not a boolean", "invalid_type");
    }
    if (auto e = GetInt(b, "logprobs", 0, kMaxTopLogprobs, &k)) return e;
    out->want_logprobs = k >= 0;
    job->logprobs = static_cast<int>(k);
  }
  // The prompt last: the costliest check.
  if (chat) {
    std::vector<int32_t> ids;
    if (auto e = ChatPrompt(b, m, &ids)) return e;
    job->prompts.push_back(std::move(ids));
    for (int32_t t : m.end_of_turn_tokens) s.stop_tokens.push_back(t);
    if (!m.end_of_turn_text.empty() && s.stop.size() <= kMaxStops) s.stop.push_back(m.end_of_turn_text);
  } else if (auto e = CompletionPrompts(b, m, &job->prompts)) {
    return e;
  }
  if (job->n_choices() > m.parallel) {
    return Bad("prompt", std::to_string(job->prompts.size()) + " prompts x n = " + std::to_string(job->n_choices()) +
                             " choices, more than the " + std::to_string(m.parallel) +
                             " sessions this server runs at once (--parallel)");
  }
  size_t longest = 0;
  for (const auto &p : job->prompts) longest = std::max(longest, p.size());
  if (static_cast<int64_t>(longest) >= m.n_ctx) {
    return Bad(chat ? "messages" : "prompt", "the prompt has " + std::to_string(longest) +
                                                 " tokens; this model's context holds " + std::to_string(m.n_ctx) +
                                                 " with at least one to generate", "context_length_exceeded");
  }
  if (max_tokens < 0) max_tokens = m.default_max_tokens >= 0 ? m.default_max_tokens : chat ? m.n_ctx : 16;
  job->max_tokens = std::max<int64_t>(max_tokens, 1);
  job->context_shift = m.context_shift;
  job->keep = m.keep;
  out->job = std::move(job);
  return std::nullopt;
}

ResponseId NewResponseId(bool chat) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08x", static_cast<unsigned long long>(rng()),
                static_cast<unsigned>(rng() & 0xffffffffu));
  return {std::string(chat ? "chatcmpl-" : "cmpl-") + hex, static_cast<int64_t>(std::time(nullptr))};
}

namespace {

std::string TokenText(const ModelInfo &m, int32_t token) {
  char buf[256];
  size_t n = 0;
  if (moe_token_to_piece(m.ctx, token, buf, sizeof buf, &n) == MOE_OK) return std::string(buf, n);
  std::string big(n, '\0');
  if (n > 0 && moe_token_to_piece(m.ctx, token, big.data(), big.size(), &n) == MOE_OK) return big;
  return "";
}

json Bytes(const std::string &s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// The chat API's logprobs entries of some tokens.
json ChatLogprobs(const ModelInfo &m, const std::vector<const TokenLogprob *> &lps) {
  json content = json::array();
  for (const TokenLogprob *lp : lps) {
    const std::string t = TokenText(m, lp->token);
    json top = json::array();
    for (const auto &[id, v] : lp->top) {
      const std::string p = TokenText(m, id);
      top.push_back({{"token", p}, {"logprob", v}, {"bytes", Bytes(p)}});
    }
    content.push_back({{"token", t}, {"logprob", lp->logprob}, {"bytes", Bytes(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// The completions API's logprobs object; text_offset counts bytes from `offset`.
json CompletionLogprobs(const ModelInfo &m, const std::vector<const TokenLogprob *> &lps, size_t offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob *lp : lps) {
    const std::string t = TokenText(m, lp->token);
    tokens.push_back(t);
    values.push_back(lp->logprob);
    json top = json::object();  // keys are the tokens' bytes: Dump replaces a partial character
    for (const auto &[id, v] : lp->top) top[TokenText(m, id)] = v;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json FinishReason(const std::string &f) { return f.empty() ? json(nullptr) : json(f); }

}  // namespace

json UsageJson(const Job &job) {
  return {{"prompt_tokens", job.prompt_tokens},
          {"completion_tokens", job.completion_tokens},
          {"total_tokens", job.prompt_tokens + job.completion_tokens}};
}

json ResponseJson(const Request &req, const ModelInfo &m, const ResponseId &rid, const std::vector<Piece> &pieces) {
  const Job &job = *req.job;
  json choices = json::array();
  for (int i = 0; i < job.n_choices(); ++i) {
    std::string text, finish;
    std::vector<const TokenLogprob *> lps;
    for (const auto &p : pieces) {
      if (p.index != i) continue;
      text += p.text;
      if (!p.finish.empty()) finish = p.finish;
      if (req.want_logprobs && p.has_token) lps.push_back(&p.logprob);
    }
    json lp = nullptr;
    if (req.want_logprobs) lp = req.chat ? ChatLogprobs(m, lps) : CompletionLogprobs(m, lps, 0);
    if (req.chat) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", text}}},
                         {"logprobs", lp},
                         {"finish_reason", FinishReason(finish)}});
    } else {
      choices.push_back({{"index", i}, {"text", text}, {"logprobs", lp}, {"finish_reason", FinishReason(finish)}});
    }
  }
  return {{"id", rid.id},
          {"object", req.chat ? "chat.completion" : "text_completion"},
          {"created", rid.created},
          {"model", m.id},
          {"choices", choices},
          {"usage", UsageJson(job)}};
}

json ChunkJson(const Request &req, const ModelInfo &m, const ResponseId &rid, const Piece &p, bool first) {
  json lp = nullptr;
  if (req.want_logprobs && p.has_token) {
    std::vector<const TokenLogprob *> one{&p.logprob};
    lp = req.chat ? ChatLogprobs(m, one) : CompletionLogprobs(m, one, 0);
  }
  json choice;
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!p.text.empty() || first) delta["content"] = p.text;
    choice = {{"index", p.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", FinishReason(p.finish)}};
  } else {
    choice = {{"index", p.index}, {"text", p.text}, {"logprobs", lp}, {"finish_reason", FinishReason(p.finish)}};
  }
  json chunk = {{"id", rid.id},
                {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", rid.created},
                {"model", m.id},
                {"choices", json::array({choice})}};
  if (req.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json UsageChunkJson(const Request &req, const ModelInfo &m, const ResponseId &rid) {
  return {{"id", rid.id},
          {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", rid.created},
          {"model", m.id},
          {"choices", json::array()},
          {"usage", UsageJson(*req.job)}};
}

json ModelsJson(const ModelInfo &m, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", m.id}, {"object", "model"}, {"created", created}, {"owned_by", "strata"}}})}};
}

}  // namespace strata::server
