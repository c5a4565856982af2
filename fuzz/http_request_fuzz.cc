// Fuzzes what a client controls on the engine's way in: HTTP/1.1 request
// framing (RequestParser with small limits, fed in chunks the input
// chooses) and the completion request JSON validation applied to every
// body it yields. Neither may crash, hang, or read out of bounds; a parser
// that has failed must keep refusing.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/api.h"
#include "http/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size, so splits land everywhere.
  const size_t chunk = 1 + data[0] % 64;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;

  wsup::http::ParserLimits limits;
  limits.max_header_bytes = 2048;
  limits.max_headers = 16;
  limits.max_body_bytes = 4096;
  wsup::http::RequestParser parser(limits);
  std::vector<wsup::http::HttpRequest> out;
  for (size_t off = 0; off < n; off += chunk) {
    const size_t len = off + chunk <= n ? chunk : n - off;
    if (!parser.Feed(bytes + off, len, &out)) {
      if (parser.error().status < 400 || parser.error().status > 599) __builtin_trap();
      break;
    }
  }
  wsup::engine::ApiLimits api;
  api.vocab = 256;
  api.context = 512;
  for (const auto& r : out) {
    if (r.body.size() > limits.max_body_bytes) __builtin_trap();
    auto req = wsup::engine::ParseCompletionRequest(r.body, api);
    if (req.ok() && (req->prompt.empty() || req->max_tokens < 1 ||
                     static_cast<int64_t>(req->prompt.size()) + req->max_tokens > api.context)) {
      __builtin_trap();
    }
  }
  // The raw input as a body too, so JSON validation is reached directly.
  auto direct = wsup::engine::ParseCompletionRequest(std::string_view(bytes, n), api);
  (void)direct;
  return 0;
}
