"""The real vLLM 0.17.1 engine: the scheduler patch (``scheduler``) and the open-loop trial harness (``runner``)."""
