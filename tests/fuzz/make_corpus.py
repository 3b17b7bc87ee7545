#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Usage: tests/fuzz/make_corpus.py <testdata> <models>
  <testdata>  shared/testdata (the real tokenizers' vectors.json)
  <models>    a folder holding tiny-llama3, tiny-qwen2 and tiny-mistral made by
              `metronome make-model --preset <name> --out <models>/<name>`
The seeds are small real inputs: valid requests and messages of the API
(docs/protocol.md), the reference texts of the real tokenizers, config.json
and safetensors headers written by make-model (with the tensors shrunk so the
files stay small), and the repository's example configuration. Deterministic:
the same inputs give the same files.
"""
import hashlib
import json
import os
import struct
import sys

root = os.path.dirname(os.path.abspath(__file__))
testdata, models = sys.argv[1], sys.argv[2]


def write(target, name, data):
    d = os.path.join(root, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# -- OpenAI request bodies and WebSocket messages ----------------------------------
chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
bodies = {
    "chat_min": (0, chat),
    "chat_stream": (0, dict(chat, stream=True, stream_options={"include_usage": True},
                            temperature=0.7, top_p=0.9, max_tokens=16)),
    "chat_parts": (0, {"messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                                    {"role": "user", "content": "b"},
                                    {"role": "assistant", "content": "c"},
                                    {"role": "user", "content": "d", "name": "x"}],
                       "stop": ["x", "y"], "seed": 3, "logprobs": True, "top_logprobs": 2}),
    "chat_penalties": (0, dict(chat, frequency_penalty=-1.5, presence_penalty=0.5,
                               top_k=5, min_p=0.1, n=1, max_completion_tokens=8,
                               logit_bias={"5": 1})),
    "completion_text": (1, {"model": "m", "prompt": "Once upon a time", "max_tokens": 4,
                            "stop": "\n", "echo": False, "best_of": 1}),
    "completion_ids": (1, {"prompt": [1, 2, 3], "temperature": 0, "logprobs": 2, "stream": True}),
    "completion_list": (1, {"prompt": ["text"], "suffix": None, "user": "u"}),
    "ws_chat": (2, dict(chat, type="chat", id="a1")),
}
for name, (mode, body) in bodies.items():
    write("openai_request", name, bytes([mode]) + json.dumps(body).encode())

ws = {
    "chat": {"type": "chat", "id": "a", "messages": [{"role": "user", "content": "hi"}]},
    "chat_params": {"type": "chat", "id": "req-2", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3, "temperature": 0.2, "stop": ["."], "logprobs": True,
                    "top_logprobs": 1, "seed": 1},
    "cancel": {"type": "cancel", "id": "a"},
    "ping": {"type": "ping"},
    "ping_id": {"type": "ping", "id": "p1"},
    "unknown": {"type": "subscribe", "id": "z"},
}
for name, msg in ws.items():
    write("ws_protocol", name, json.dumps(msg))

# -- raw HTTP requests (first byte: 0 open server, 1 server with a key) --------------


def http(method, path, body=b"", headers=()):
    if isinstance(body, str):
        body = body.encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += list(headers)
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def ws_frame(text):
    payload = text.encode()
    mask = b"\x01\x02\x03\x04"
    assert len(payload) < 126
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + masked


chat_script = lambda s: json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": s}]})
key = "Authorization: Bearer fuzz-key"
requests = {
    "health": (0, http("GET", "/health")),
    "models": (0, http("GET", "/v1/models")),
    "model": (0, http("GET", "/v1/models/fake-model")),
    "metrics": (0, http("GET", "/metrics")),
    "chat": (0, http("POST", "/v1/chat/completions", chat_script("echo a b c"))),
    "chat_stream": (0, http("POST", "/v1/chat/completions",
                            json.dumps({"messages": [{"role": "user", "content": "count 3"}],
                                        "stream": True, "stream_options": {"include_usage": True}}))),
    "completion": (0, http("POST", "/v1/completions",
                           json.dumps({"model": "fake-model", "prompt": "late-error", "logprobs": 1}),
                           ["X-KV-Cache-Mode: paged", "X-No-Batch: true"])),
    "pipelined": (0, http("GET", "/health") + http("POST", "/v1/completions",
                                                    json.dumps({"prompt": "error 2"}))
                  + http("GET", "/v1/models")),
    "chunked": (0, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n12\r\nmpt\":\"echo x\"}    \r\n0\r\n\r\n"),
    "http10": (0, b"GET /v1/models HTTP/1.0\r\n\r\n"),
    "keyed_chat": (1, http("POST", "/v1/chat/completions", chat_script("params"), [key])),
    "keyed_no_key": (1, http("POST", "/v1/completions", json.dumps({"prompt": "x"}))),
    "keyed_preflight": (1, http("OPTIONS", "/v1/chat/completions", b"",
                                ["Origin: http://allowed.example", "Access-Control-Request-Method: POST",
                                 "Access-Control-Request-Headers: authorization, content-type"])),
    "keyed_bad_host": (1, b"GET /v1/models HTTP/1.1\r\nHost: evil.example\r\n" + key.encode() + b"\r\n\r\n"),
    "ws_upgrade": (0, b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                   + ws_frame(json.dumps({"type": "ping", "id": "p"}))
                   + ws_frame(json.dumps({"type": "chat", "id": "a", "messages": [{"role": "user", "content": "echo x"}]}))),
    "ws_keyed": (1, b"GET /v1/ws?api_key=fuzz-key HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nOrigin: http://allowed.example\r\nSec-WebSocket-Protocol: chat, bearer.fuzz-key\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                 + ws_frame(json.dumps({"type": "cancel", "id": "a"}))),
}
for name, (mode, raw) in requests.items():
    write("http_request", name, bytes([mode]) + raw)

# -- tokenizer: the reference texts (mode: tokenizer, options) and some ids ---------
vectors = json.load(open(os.path.join(testdata, "tokenizers", "vectors.json")))
picked = ["SIMPLE", "PYTHON_CODE", "CHINESE_ONLY", "MULTIBYTE_EMOJIS", "TEXT_WITH_ESCAPE_CHARACTERS",
          "CONTROL_TOKENS", "NEWLINE_AND_TAB", "SPIECE_UNDERSCORE", "CURRENCY_WITH_DECIMALS", "DOUBLE_SPACE"]
for i, name in enumerate(picked):
    case = vectors["llama3"][name]
    mode = (i % 3) | (0x04 if i % 2 else 0) | (0x08 if i % 4 < 2 else 0) | (0x20 if i % 5 else 0)
    write("tokenizer", name.lower(), bytes([mode]) + case["text"].encode())
    ids = case["ids"]
    write("tokenizer", name.lower() + "_ids", bytes([0x10 | 0x20]) + struct.pack(f"<{len(ids)}i", *ids))
write("tokenizer", "special_text", bytes([0x08 | 0x04 | 1]) + "<|im_start|>user\nhi<|im_end|>".encode())
write("tokenizer", "split_utf8_ids", bytes([0x10]) + struct.pack("<4i", 99, 254, 128000, -1))

# -- config.json and safetensors from make-model ------------------------------------
for preset in ["tiny-llama3", "tiny-qwen2", "tiny-mistral"]:
    folder = os.path.join(models, preset)
    with open(os.path.join(folder, "config.json"), "rb") as f:
        write("model_config", preset, f.read())
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head)
        header = json.loads(f.read(n))
    # The same header with every dimension shrunk to at most 2, so the file is small.
    offset, shrunk = 0, {}
    for name in sorted(header):
        info = header[name]
        if name == "__metadata__":
            shrunk[name] = info
            continue
        shape = [min(d, 2) for d in info["shape"]]
        size = {"F32": 4, "F16": 2, "BF16": 2}[info["dtype"]]
        for d in shape:
            size *= d
        shrunk[name] = {"dtype": info["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(shrunk, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    write("safetensors", preset, struct.pack("<Q", len(text)) + text + bytes(offset))
    # The real header with its data cut off: the truncated-file path.
    write("safetensors", preset + "_truncated", head + json.dumps(header, separators=(",", ":")).encode() + bytes(64))

extra_configs = {
    "llama31_rope": {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
                     "rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                     "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16"},
    "qwen2_sliding": {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
                      "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "use_sliding_window": True, "sliding_window": 32,
                      "max_window_layers": 2, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
                      "dtype": "float16"},
    "mistral_layer_types": {"architectures": ["MistralForCausalLM"], "vocab_size": 32000, "hidden_size": 64,
                            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                            "head_dim": 16, "sliding_window": 4096,
                            "layer_types": ["sliding_attention", "full_attention"], "torch_dtype": "float32"},
}
for name, doc in extra_configs.items():
    write("model_config", name, json.dumps(doc, indent=2))

handmade = {"scalar_f32": {"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}},
            "empty_dim": {"__metadata__": {"format": "pt"}, "b": {"dtype": "F16", "shape": [0, 3], "data_offsets": [0, 0]}},
            "unsupported_dtype": {"c": {"dtype": "I8", "shape": [2], "data_offsets": [0, 2]}}}
for name, header in handmade.items():
    text = json.dumps(header).encode()
    write("safetensors", name, struct.pack("<Q", len(text)) + text + bytes(4))

# -- metronome.yaml ----------------------------------------------------------------------
repo = os.path.dirname(os.path.dirname(root))
with open(os.path.join(repo, "config", "metronome.example.yaml"), "rb") as f:
    write("config_yaml", "example", f.read())
yamls = {
    "sections": "server:\n  host: 0.0.0.0\n  port: 9000\n  max_body_bytes: 2MiB\n  max_ws_message_bytes: 1500KB\n"
                "model:\n  path: /models/llama\n  device: cuda:3\n  chat_template: chatml\n"
                "engine:\n  cuda_graphs: off\n  gpu_memory_fraction: 1\n  kv_cache_dtype: fp8\n  policy: srpt\n"
                "supervisor:\n  drift:\n    window_s: 2.5\n  executor:\n    max_restarts: 0\nlogging:\n  level: debug\n",
    "flow": "{server: {port: 8081, api_keys: [a, 'b c'], allowed_origins: ['http://x.example']}, batching: {max_batch_size: 8}}\n",
    "anchors": "base: &b\n  port: 1\nserver:\n  <<: *b\n  host: \"::1\"\n",
    "quoted": "server:\n  host: 'localhost'\n  drain_timeout_s: 2.5\n  tls:\n    cert_file: \"/tmp/a b.pem\"\n    key_file: /tmp/k.pem\n",
    "empty": "",
}
for name, text in yamls.items():
    write("config_yaml", name, text)
