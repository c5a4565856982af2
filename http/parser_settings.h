// The http_parser_settings table of one of wsup's HTTP parsers, built once
// per parser class from its static callbacks.
//
// http-parser calls plain functions through a settings table. wsup has three
// parsers on it: the server's RequestParser (request.h), the client's
// response reader (client.cc) and the front's upstream connection
// (front/upstream.h). Each names its callbacks the same way, so the table is
// filled here, from those names, and not field by field in each of them.
//
// A parser class keeps its callbacks private and befriends the template it
// uses:
//   template <typename> friend const http_parser_settings* http::ResponseSettings();
// A callback it lacks is a compile error, not a silently empty slot.
#pragma once

#include <http_parser.h>

namespace wsup::http {

// A response parser: OnHeaderField, OnHeaderValue, OnHeadersComplete,
// OnBody, OnMessageComplete.
template <typename T>
const http_parser_settings* ResponseSettings() {
  static const http_parser_settings settings = [] {
    http_parser_settings s;
    http_parser_settings_init(&s);
    s.on_header_field = &T::OnHeaderField;
    s.on_header_value = &T::OnHeaderValue;
    s.on_headers_complete = &T::OnHeadersComplete;
    s.on_body = &T::OnBody;
    s.on_message_complete = &T::OnMessageComplete;
    return s;
  }();
  return &settings;
}

// A request parser: the five above, and OnMessageBegin and OnUrl.
template <typename T>
const http_parser_settings* RequestSettings() {
  static const http_parser_settings settings = [] {
    http_parser_settings s = *ResponseSettings<T>();
    s.on_message_begin = &T::OnMessageBegin;
    s.on_url = &T::OnUrl;
    return s;
  }();
  return &settings;
}

}  // namespace wsup::http
