// The headers the front writes and relays: what an engine's request head is
// made of (the client's headers less those of one hop and those only the
// front may set), and which of an engine's answer headers reach the client.
// Pure functions of their arguments; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "http/request.h"

namespace wsup::front {

// Headers that describe one hop of the exchange (RFC 9110 7.6.1), and the
// framing headers each side writes for itself.
bool IsHopByHop(std::string_view name);
// True when `name` is one of the comma-separated tokens of a Connection
// header value (those headers are hop-by-hop too).
bool ListedIn(std::string_view connection_value, std::string_view name);
const std::string* FindHeader(const std::vector<http::Header>& headers, std::string_view name);
bool StartsWithNoCase(std::string_view s, std::string_view prefix);
// The headers say text/event-stream.
bool IsEventStream(const std::vector<http::Header>& headers);

// The engine's request head for `r` with `body` (its length is sent).
// `host`: the Host header when the client sent none. `cut`: the request
// was cut on an engine that failed (X-Wsup-Resume: cut). `target`: the
// request target in place of the client's (a chat's continuation is a
// completion); empty keeps the client's.
void BuildRequestHead(const http::HttpRequest& r, std::string_view host, std::string_view body, bool cut,
                      std::string* out, std::string_view target = {});

// The engine's answer headers the client gets (moved out of `headers`),
// and the Content-Length it announced (SIZE_MAX: none, or chunked).
std::vector<http::Header> RelayedHeaders(std::vector<http::Header>* headers, size_t* announced);

}  // namespace wsup::front
