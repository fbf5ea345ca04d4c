"""Request validation and chat templating of the ``llm`` stage: the chat contract's parsers
(``omni_triton.contracts.chat``) plus the model's tokenizer and vLLM's own value checks; every
problem is a :class:`~omni_triton.contracts.chat.ChatInputError`, i.e. INVALID_ARG.
"""
from __future__ import annotations

from omni_triton.contracts.chat import ChatInputError, parse_messages, parse_sampling

# the request vLLM runs, shared with the runtime (which must not import stages)
from omni_triton.runtime.vllm_request import GenerationJob, make_sampling_params


def render_chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """The model's chat template applied with ``add_generation_prompt=True`` (as vLLM's OpenAI
    server does), as text."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def build_generation_job(request_id: str, tokenizer, prompt: str | None, messages: str | None,
                         sampling: str | None, max_model_len: int, default_max_tokens: int,
                         check_with_vllm: bool = True) -> GenerationJob:
    """Validate one request and tokenize its prompt.

    Exactly one of ``prompt`` (raw text, tokenized as is) and ``messages`` (JSON, chat template
    applied; the template already holds the special tokens, so none are added) must be given.
    ``max_tokens`` defaults to ``min(default_max_tokens, max_model_len - prompt_len)``; a prompt
    of ``max_model_len`` tokens or more, or ``prompt_len + max_tokens > max_model_len``, is an
    error (as vLLM's OpenAI server does).

    ``check_with_vllm=False`` skips building vLLM's ``SamplingParams`` (for callers that do not
    import vLLM, e.g. the ``llm_tts`` BLS validating before it calls ``llm``).

    Raises:
        ChatInputError: anything wrong with the inputs.
    """
    if (prompt is None) == (messages is None):
        raise ChatInputError("send exactly one of PROMPT and MESSAGES")
    kwargs = parse_sampling(sampling)
    if messages is not None:
        text = render_chat(tokenizer, parse_messages(messages))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if not prompt:
            raise ChatInputError("PROMPT is empty")
        ids = tokenizer(prompt)["input_ids"]
    n = len(ids)
    if n >= max_model_len:
        raise ChatInputError(f"the prompt has {n} tokens; this model's context is {max_model_len} "
                            "tokens (prompt + completion)")
    if "max_tokens" in kwargs:
        if n + kwargs["max_tokens"] > max_model_len:
            raise ChatInputError(f"prompt ({n} tokens) + max_tokens ({kwargs['max_tokens']}) exceeds "
                                f"this model's context of {max_model_len} tokens")
    else:
        kwargs["max_tokens"] = min(default_max_tokens, max_model_len - n)
    if check_with_vllm:
        make_sampling_params(kwargs)  # vLLM's own value checks, here so they are INVALID_ARG
    return GenerationJob(request_id=request_id, prompt_ids=list(ids), sampling=kwargs)
