// Compiles the C++ header over the C ABI as strict C++17 (-std=c++17 -pedantic -Werror), with
// every inline member instantiated by a use.
#include <strata/moe.hpp>

int strata_cxx17_header_check(const char *path) {
  try {
    strata::Context ctx{std::string(path)};
    strata::Session s = ctx.session();
    s.feed({1, 2, 3});
    s.feed(ctx.tokenize("text"));
    while (ctx.step_for(std::chrono::microseconds(1000)) > 0) {
    }
    (void)ctx.step();
    strata::Span<const float> l = s.logits();
    strata::Session f = s.fork();
    f.rewind(1);
    f.shift(1, 1);
    const std::vector<uint8_t> bytes = s.save();
    strata::Session g = ctx.load(bytes);
    strata::TextPiece p = g.sample_text();
    (void)g.text_end();
    (void)ctx.detokenize(std::vector<int32_t>{p.token});
    (void)ctx.plan();
    (void)ctx.stats();
    (void)ctx.kv_usage();
    ctx.abort();
    strata::set_log(nullptr);
    strata::set_log([](int32_t, std::string_view) {});
    strata::set_log(std::function<void(int32_t, std::string_view)>());
    return static_cast<int>(l.size()) + s.sample() + static_cast<int>(strata::version().size());
  } catch (const strata::Error &e) {
    return -static_cast<int>(e.category());
  }
}
