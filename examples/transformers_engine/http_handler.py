"""The example engine's HTTP side (server.py runs it): the threaded server,
with its connection limit, and the handler of each route, in the reference
engine's words (engine/engine_server.h). The engine it serves (server.py's
Engine: admission, the model, counters, state) is the server's `engine`.
"""

import hmac
import logging
import os
import select
import socket
import socketserver
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import api

ENGINE_NAME = "wsup-transformers-example"
VERSION = "0.1.0"

POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)

log = logging.getLogger(ENGINE_NAME)


ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/health": "GET", "/wsup/status": "GET",
          "/v1/models": "GET"}


class ClientGone(Exception):
    pass


class Server(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections never hold up an exit
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, engine):
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.engine = engine
        self._conns = 0
        self._conns_lock = threading.Lock()
        super().__init__(address, Handler)

    def server_bind(self):
        # HTTPServer.server_bind asks the resolver for the host's full name,
        # which can stall a machine without DNS; the name is never used.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address):
        with self._conns_lock:
            full = self._conns >= self.engine.opts.max_connections
            if not full:
                self._conns += 1
        if full:
            body = api.error_json("the engine has %d connections open, its limit (--max-connections); retry "
                                  "later" % self.engine.opts.max_connections, "unavailable_error").encode()
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) +
                                body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            with self._conns_lock:
                self._conns -= 1
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conns_lock:
                self._conns -= 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = ENGINE_NAME + "/" + VERSION

    def version_string(self):
        return self.server_version

    def setup(self):
        self.timeout = self.server.engine.opts.idle_timeout_ms / 1000.0
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    # Errors the standard library raises itself (a bad request line, headers
    # too long) get the engine's JSON shape too.
    def send_error(self, code, message=None, explain=None):
        if self.request_version == "HTTP/0.9":  # a request line too broken to name a version: answer in 1.1
            self.request_version = "HTTP/1.1"
        self._send_json(code, api.error_json(message or explain or "bad request", "invalid_request_error"),
                        close=True)

    def handle_expect_100(self):
        n = self._content_length()
        if n is not None and n > self.server.engine.opts.max_body_bytes:
            self._too_large(n)
            return False
        return super().handle_expect_100()

    def do_GET(self):
        self._route("GET")

    def do_HEAD(self):
        self._route("HEAD")

    def do_POST(self):
        self._route("POST")

    def do_PUT(self):
        self._route("PUT")

    def do_DELETE(self):
        self._route("DELETE")

    def do_PATCH(self):
        self._route("PATCH")

    def do_OPTIONS(self):
        self._route("OPTIONS")

    # ------------------------------------------------------------ plumbing

    def _send_json(self, code, body, headers=(), close=False):
        data = body.encode("utf-8")
        # While stopping, no connection is kept for another request.
        close = close or self.server.engine.stopping()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _error(self, code, message, kind, headers=(), close=False):
        self._send_json(code, api.error_json(message, kind), headers, close)

    def _content_length(self):
        v = self.headers.get("Content-Length")
        if v is None:
            return None
        v = v.strip()
        return int(v) if v.isdigit() else -1

    def _too_large(self, n):
        self._error(413, "the request body of %d bytes exceeds the limit of %d bytes (--max-body-bytes); send a "
                         "smaller body" % (n, self.server.engine.opts.max_body_bytes), "invalid_request_error",
                    close=True)

    def _read_body(self):
        """The body, or None after answering an error (the connection then
        closes: what is left of the body cannot be skipped safely)."""
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "chunked request bodies are not accepted; send Content-Length", "invalid_request_error",
                        close=True)
            return None
        n = self._content_length()
        if n is None:
            return b""
        if n < 0:
            self._error(400, "Content-Length %r is not a byte count" % self.headers.get("Content-Length"),
                        "invalid_request_error", close=True)
            return None
        if n > self.server.engine.opts.max_body_bytes:
            self._too_large(n)
            return None
        try:
            body = self.rfile.read(n)
        except OSError:
            self.close_connection = True
            return None
        if len(body) != n:
            self.close_connection = True  # the client went away mid-body
            return None
        return body

    def _peer_gone(self):
        """True when the client closed, erred or sent EOF: the house rule
        (docs/front.md, "A client that goes away")."""
        sock = self.connection
        try:
            p = select.poll()
            p.register(sock, select.POLLIN | POLLRDHUP)
            events = p.poll(0)
        except (OSError, ValueError):
            return True
        for _, mask in events:
            if mask & (select.POLLERR | select.POLLHUP | select.POLLNVAL | POLLRDHUP):
                return True
            if mask & select.POLLIN:
                try:
                    return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError:
                    return True
        return False

    def _route(self, method):
        body = self._read_body()
        if body is None:
            return
        path = self.path.split("?", 1)[0]
        # Checked before the route and the method: nothing about the control
        # routes is told to anyone but the supervisor.
        if (path == "/wsup" or path.startswith("/wsup/")) and not self._control_allowed(self.server.engine):
            return
        want = ROUTES.get(path)
        if want is None:
            self._error(404, "no route %s; the engine serves POST /v1/completions and /v1/chat/completions, GET "
                             "/v1/models, /health and /wsup/status" % path[:200], "not_found_error")
            return
        if method != want and not (want == "GET" and method == "HEAD"):
            self._error(405, "method %s is not allowed on %s; use %s" % (method, path, want),
                        "invalid_request_error", headers=(("Allow", want),))
            return
        eng = self.server.engine
        if path == "/health":
            self._send_json(200, api.dumps({"status": "ok", "state": eng.state}))
        elif path == "/wsup/status":
            self._send_json(200, api.dumps(eng.status()))
        elif path == "/v1/models":
            self._models()
        else:
            eng.enter_request()
            try:
                self._completion(body, chat=path == "/v1/chat/completions")
            finally:
                eng.leave_request()

    def _control_allowed(self, eng):
        """The control routes answer only the supervisor: its token, compared in constant time."""
        token = eng.control_token
        if not token:
            return True
        auth = self.headers.get("Authorization") or ""
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return True
        self._error(401, "the engine's control routes (/wsup/...) are the supervisor's: send 'Authorization: Bearer' "
                         "with the token the supervisor gave this engine in WSUP_CONTROL_TOKEN",
                    "authentication_error", headers=(("WWW-Authenticate", "Bearer"),))
        return False

    def _models(self):
        eng = self.server.engine
        st = eng.status()
        m = {"id": st["model"], "object": "model", "owned_by": "wsup", "root": eng.opts.model}
        if eng.model is not None:
            m["max_model_len"] = eng.model.context
        self._send_json(200, api.dumps({"object": "list", "data": [m]}))

    # ------------------------------------------------------------ completions

    def _completion(self, body, chat=False):
        eng = self.server.engine
        model = eng.model
        if eng.stopping():
            eng.count("rejected_stopping")
            self._error(503, "the engine is stopping; send the request to another engine", "unavailable_error",
                        headers=(("Retry-After", "1"),), close=True)
            return
        if eng.state != "ready" or model is None:
            self._error(503, "the engine is %s (loading the model); retry when GET /wsup/status says ready" %
                        eng.state, "unavailable_error", headers=(("Retry-After", "1"),))
            return
        try:
            if chat:
                req = api.parse_chat(body, model.context, model.tokenizer.render_chat)
            else:
                req = api.parse_completion(body, model.vocab_size, model.context, model.tokenizer.encode)
        except api.ApiError as e:
            eng.count("bad_requests")
            self._error(400, str(e), "invalid_request_error")
            return
        # A request waiting for a turn when SIGTERM comes is in flight: it
        # may still run within the drain; only the drain's end refuses it.
        turn = eng.admission.enter(self._peer_gone, eng.opts.queue_timeout_ms / 1000.0, eng.hard_stop.is_set)
        if turn != "ok":
            if turn == "gone":
                eng.count("cancelled")
                self.close_connection = True
            elif turn == "stopping":
                eng.count("rejected_stopping")
                self._error(503, "the engine is stopping; send the request to another engine", "unavailable_error",
                            headers=(("Retry-After", "1"),), close=True)
            else:
                eng.count("rejected_busy")
                why = ("%d requests are waiting already (--max-waiting)" % eng.opts.max_waiting if turn == "busy"
                       else "no generation slot came free within %d ms (--queue-timeout-ms)" %
                       eng.opts.queue_timeout_ms)
                self._error(503, "the engine is busy: %s; retry later" % why, "unavailable_error",
                            headers=(("Retry-After", "1"),))
            return
        try:
            self._generate(model, req)
        finally:
            eng.admission.leave()

    def _completion_id(self, chat=False):
        prefix = "chatcmpl-" if chat else "cmpl-"
        rid = self.headers.get("X-Request-Id", "")
        if rid and len(rid) <= 128 and all(c.isalnum() or c in "-_.:" for c in rid):
            return prefix + rid
        return prefix + uuid.uuid4().hex

    def _generate(self, model, req):
        eng = self.server.engine
        cid = self._completion_id(req.chat)
        created = int(time.time())
        seed = req.seed if req.seed is not None else int.from_bytes(os.urandom(8), "little")
        chunked = self.request_version != "HTTP/1.0"
        tokens = []
        finish = None
        stream = None
        if req.stream:
            stream = _Stream(self, chunked)
            if not stream.start():
                eng.count("cancelled")
                return
            if req.chat:
                # A chat stream opens with the role (and the prompt's ids).
                stream.event(api.chat_role_chunk_json(cid, created, model.name,
                                                      req.prompt if req.return_token_ids else None))
        # One decoder primed with the prompt for a stream and for a whole
        # answer: a prompt that ends inside a character (a continuation) is
        # completed by the first new id in both.
        decoder = model.tokenizer.incremental(req.prompt)
        gen = model.generate(req.prompt, req.max_tokens, req.temperature, seed)
        outcome = "finished"
        try:
            for tok in gen:
                tokens.append(tok)
                if tok in model.eos_ids:
                    finish = "stop"
                elif len(tokens) >= req.max_tokens:
                    finish = "length"
                if stream is not None:
                    text = decoder.push([tok]) + (decoder.flush() if finish else "")
                    if req.chat:
                        stream.event(api.chat_chunk_json(cid, created, model.name, text, [tok], finish,
                                                         req.return_token_ids))
                    else:
                        first = req.return_token_ids and len(tokens) == 1
                        stream.event(api.stream_chunk_json(cid, created, model.name, text, [tok], finish,
                                                           req.return_token_ids, req.prompt if first else None))
                if finish:
                    break
                if self._peer_gone():
                    raise ClientGone()
                if eng.hard_stop.is_set():
                    outcome = "cut"
                    break
        except (ClientGone, OSError):
            outcome = "cancelled"
        except Exception as e:  # the model failed: answer it, keep serving others
            log.error("generation failed: %s\n%s", e, traceback.format_exc())
            outcome = "failed"
            msg = "generation failed: %s" % e
            if stream is not None:
                try:
                    stream.event(api.error_json(msg, "server_error"))
                    stream.event("[DONE]")
                    stream.end()
                except OSError:
                    self.close_connection = True
            else:
                self._error(500, msg, "server_error")
        finally:
            gen.close()  # frees the sequence's KV cache now, not at garbage collection
        eng.count("generated_tokens", len(tokens))
        if outcome != "finished":
            eng.count(outcome)
            if outcome in ("cancelled", "cut"):
                # No final chunk and no [DONE]: the front resumes a cut stream
                # on the other engine, and retries a cut answer.
                self.close_connection = True
                if outcome == "cut":
                    log.warning("request %s cut after %d tokens: the drain timeout passed", cid, len(tokens))
            return
        eng.count("finished")
        if stream is not None:
            try:
                if req.include_usage:
                    stream.event(api.usage_chunk_json(cid, created, model.name, len(req.prompt), len(tokens),
                                                      req.chat))
                stream.event("[DONE]")
                stream.end()
            except OSError:  # gone after its last token: nothing to cancel
                stream.ok = False
            if not stream.ok:
                self.close_connection = True
            return
        text = decoder.push(tokens) + decoder.flush()
        answer = api.chat_completion_json if req.chat else api.completion_json
        self._send_json(200, answer(cid, created, model.name, text, tokens, finish, req.return_token_ids, req.prompt))


class _Stream:
    """A server-sent event stream on the handler's connection: chunked on
    HTTP/1.1, framed by the connection's end on HTTP/1.0. A failed write
    raises OSError (the client is gone)."""

    def __init__(self, handler, chunked):
        self.h = handler
        self.chunked = chunked
        self.ok = True

    def start(self):
        h = self.h
        try:
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            if self.chunked:
                h.send_header("Transfer-Encoding", "chunked")
            if not self.chunked or h.server.engine.stopping():
                h.send_header("Connection", "close")
                h.close_connection = True
            h.end_headers()
            return True
        except OSError:
            h.close_connection = True
            self.ok = False
            return False

    def _write(self, data):
        if self.chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        self.h.wfile.write(data)

    def event(self, data):
        self._write(api.sse(data))

    def end(self):
        try:
            if self.chunked:
                self.h.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.ok = False


# ---------------------------------------------------------------- main
