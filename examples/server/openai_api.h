// OpenAI's API over the engine: requests to /v1/completions and /v1/chat/completions checked field by
// field into a Job (a bad field is an ApiError naming it, never a crash), and the engine's pieces
// written back as OpenAI's response objects and streaming chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "examples/server/engine.h"
#include "include/strata/moe.h"
#include "nlohmann/json.hpp"

namespace strata::server {

// OpenAI's error object: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string code;   // "" = null
  std::string param;  // "" = null
};
nlohmann::json ErrorJson(const ApiError &e);
// JSON text; invalid UTF-8 (a token's partial character) is replaced, never thrown.
std::string Dump(const nlohmann::json &j);

// What requests are checked against and filled from.
struct ModelInfo {
  std::string id;  // the model's name in /v1/models and in responses
  moe_ctx *ctx = nullptr;
  int32_t n_vocab = 0;
  int64_t n_ctx = 0;           // positions per session
  int parallel = 1;            // sessions at once: the most choices one request may ask for
  std::string chat_template;   // "" when the model has none Strata renders (chat answers 400)
  std::string template_error;  // why, then
  Sampling defaults;           // the server's sampling flags; each request may override them
  std::vector<int32_t> end_of_turn_tokens;  // the chat template's end of turn, when one token
  std::string end_of_turn_text;             // else as a stop string ("" for none)
  int64_t default_max_tokens = -1;  // -n; -1: 16 for completions, the rest of the context for chat
  bool context_shift = false;       // --context-shift: max_tokens may pass n_ctx (Job::context_shift)
  int32_t keep = 0;                 // --keep
};

struct Request {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool want_logprobs = false;  // chat: logprobs; completions: logprobs given
  std::shared_ptr<Job> job;
};

// Reads a request body as JSON through the library's bounded reader (lib/format/json.h: nesting
// past its limit is refused, so no later copy, walk or dump of the value can exhaust the stack);
// on failure returns the 400 to answer, naming what is wrong.
std::optional<ApiError> ParseBody(std::string_view text, nlohmann::json *out);

// Checks `body` and fills `out`; on a bad request returns the error to answer.
std::optional<ApiError> ParseRequest(const nlohmann::json &body, bool chat, const ModelInfo &model, Request *out);

// A response's identity: "cmpl-…" / "chatcmpl-…" and its creation time.
struct ResponseId {
  std::string id;
  int64_t created = 0;
};
ResponseId NewResponseId(bool chat);

// The whole response of a finished job (non-streaming).
nlohmann::json ResponseJson(const Request &req, const ModelInfo &model, const ResponseId &rid,
                            const std::vector<Piece> &pieces);
// One streamed chunk for a piece; the chat's first chunk of a choice carries its role.
nlohmann::json ChunkJson(const Request &req, const ModelInfo &model, const ResponseId &rid, const Piece &piece,
                         bool first_of_choice);
// The last chunk with stream_options.include_usage: no choices, the usage.
nlohmann::json UsageChunkJson(const Request &req, const ModelInfo &model, const ResponseId &rid);
// The `usage` object of a job.
nlohmann::json UsageJson(const Job &job);
// GET /v1/models.
nlohmann::json ModelsJson(const ModelInfo &model, int64_t created);

}  // namespace strata::server
