"""The API server in front of the engine, measured on the real ``vllm serve`` on this CPU.

vLLM 0.17.1 serves ``/v1/completions`` and ``/v1/chat/completions`` from one process with one asyncio event loop
(``vllm/entrypoints/openai/api_server.py``): it parses the HTTP request and its pydantic body, renders the chat
template (chat endpoint), tokenizes the prompt on a one-thread executor (``vllm/utils/async_utils.py``,
``AsyncMicrobatchTokenizer``), builds the engine request (``InputProcessor``) and sends it to the EngineCore
process over ZMQ (``AsyncLLM.add_request``). On the way back, ``AsyncLLM._run_output_handler``'s task pulls each
iteration's ``EngineCoreOutputs``, detokenizes every request's new token (``OutputProcessor.process_outputs``) and
wakes the request's stream, which formats one server-sent event per token. All of it shares the GIL, so the front
end is one queue whose work grows with requests, prompt tokens and output tokens.

* ``tokenizer``: a byte-level BPE tokenizer of Qwen2/Qwen3's form (151,643 tokens and the same pre-tokenizer
  pattern), trained here on the Python standard library, because no tokenizer can be downloaded.
* ``serve``: starts ``vllm serve`` on a tiny Qwen3 with dummy weights and that tokenizer.
* ``measure``: the requests sent and what is recorded (client times, the server's own metrics, the API server's
  CPU time).
* ``fit``: the front-end costs (``dlfp.devices.host.FrontendCosts``) fitted to those measurements.
"""
