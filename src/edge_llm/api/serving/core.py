"""What every endpoint family of one model shares, made once per model (`serving.build_serving`) and handed to
each family's serving object: the chat prompt builder (the model's chat template, compiled once) and the grammar
cache (serving/grammars.py). The chat-like families (chat, Messages, Responses, Ollama) are adapters around it:
each turns its protocol's body into chat messages and tools, and its answer into its wire shapes; the tool-call
tail they share is serving/tool_calls.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from edge_llm.api.errors import invalid_request
from edge_llm.api.serving.grammars import Grammars
from edge_llm.engine.facade import EngineClient
from edge_llm.prompting.chat_template import ChatTemplate
from edge_llm.prompting.prompt import PromptBuilder

logger = logging.getLogger(__name__)


class ModelCore:
    def __init__(self, engine: EngineClient, model_id: str, chat_template: str | None = None) -> None:
        """`chat_template`: a Jinja source that replaces the GGUF's (--chat-template, checked at start-up)."""
        self.engine = engine
        self.model_id = model_id
        self.chat_template = chat_template
        self.grammars = Grammars(engine)
        self._prompt_builder: PromptBuilder | None = None
        self._lock = threading.Lock()  # the tokenizer and the bulk thread may both ask for the builder first

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                    continue_final: bool = False, before_tokenizing: Callable[[int], None] | None = None
                    ) -> list[int]:
        """Messages → tokens through the model's chat template (runs in the tokenizer thread); see
        PromptBuilder.build for `continue_final` and `before_tokenizing`."""
        return self._builder().build(messages, tools=tools, continue_final=continue_final,
                                     before_tokenizing=before_tokenizing)

    def chat_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """The text `chat_prompt` tokenizes, generation prompt added (llama-server's /apply-template)."""
        segments = self._builder().template.render(messages, tools=tools, add_generation_prompt=True)
        return "".join(segment.text for segment in segments)

    def _builder(self) -> PromptBuilder:
        with self._lock:
            if self._prompt_builder is None:
                info = self.engine.model_info
                assert info is not None  # the tokenizer thread runs only while the model is loaded
                source = self.chat_template or info.chat_template
                if not source:
                    raise invalid_request(
                        f"The model '{self.model_id}' has no chat template (a base model): it cannot take chat "
                        "messages. Send the text to continue to /v1/completions instead", param="messages",
                        code="chat_template_missing")
                template = ChatTemplate(source, bos_token=info.bos_text, eos_token=info.eos_text)
                self._prompt_builder = PromptBuilder(template, self.engine, bos_token=info.bos_token,
                                                     control_tokens=info.control_tokens)
                logger.info("compiled the chat template")
            return self._prompt_builder
