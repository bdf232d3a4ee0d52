"""The OpenAI-compatible server: HTTP API (`app`), continuous-batching scheduler, wire format
(`protocol`) and Prometheus metrics."""
