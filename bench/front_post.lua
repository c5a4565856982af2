-- wrk: POST a one-token greedy completion (the proxy's cost shows beside
-- the engine's least work). Used by bench/front.sh.
wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"prompt":"Hello, world","max_tokens":1,"temperature":0}'
