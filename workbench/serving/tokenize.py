"""`/tokenize` and `/detokenize`: the model's tokenizer, over the API.

`/tokenize` takes a prompt, or chat messages rendered with the same template rules as chat
completions; it reports the count and `max_model_len` but does not enforce it (as vLLM).
"""

from __future__ import annotations

from workbench.serving.base import EngineServing
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from workbench.serving.unsupported import refuse_unknown_fields


class TokenizeServing(EngineServing):
    supports_lora = True  # an adapter shares the base model's tokenizer

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.renderer = ChatRenderer.for_server(self.tokenizer, self.config)

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        refuse_unknown_fields(request)
        if isinstance(request, TokenizeChatRequest):
            tools = ([t.model_dump(exclude_none=True) for t in request.tools]
                     if request.tools else None)
            text = self.renderer.render(
                request.messages, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                chat_template=request.chat_template,
                chat_template_kwargs=request.chat_template_kwargs, tools=tools).prompt
        else:
            text = request.prompt
        ids = list(self.tokenizer(text, add_special_tokens=request.add_special_tokens).input_ids)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.max_model_len, tokens=ids,
                                token_strs=strs)

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        refuse_unknown_fields(request)
        # the reference leaves this to the tokenizer (an unknown id decodes to ""); OpenAI and
        # the generation endpoints refuse it, so a wrong id is never read back as empty text
        self.prompts.check_token_ids(request.tokens, "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(request.tokens))
