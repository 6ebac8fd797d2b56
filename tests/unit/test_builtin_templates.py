"""--chat-template's built-in names render a conversation in their format, and the start-up check refuses what
cannot serve (prompting/builtin_templates.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_llm.prompting.builtin_templates import BUILTIN_TEMPLATES, chosen_template
from edge_llm.prompting.chat_template import ChatTemplate, TemplateError

TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
EXPECTED = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
              "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\n",
    "gemma": "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "llama2": "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]",
    "mistral-v7": "<s>[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello</s>[INST] Bye[/INST]",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n",
    "zephyr": "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n<|user|>\nBye</s>\n"
              "<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_a_builtin_name_renders_its_format(name: str) -> None:
    source = chosen_template(name, None)
    assert source == BUILTIN_TEMPLATES[name]
    segments = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(TURNS)
    assert "".join(segment.text for segment in segments) == EXPECTED[name]


def test_a_jinja_string_or_file_is_taken_as_given(tmp_path: Path) -> None:
    jinja = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert chosen_template(jinja, None) == jinja
    path = tmp_path / "t.jinja"
    path.write_text(jinja)
    assert chosen_template(None, path) == jinja
    assert chosen_template(None, None) is None


@pytest.mark.parametrize(("value", "said"), [
    ("{% if %}", "does not compile"),
    ("{% set seen = [] %}{{ seen.append(1) }}", "fails on a conversation of one user message: .*unsafe operation"),
    ("chatmll", "neither a built-in template name"),
])
def test_what_cannot_serve_is_refused_with_the_reason(value: str, said: str) -> None:
    with pytest.raises(TemplateError, match=said):
        chosen_template(value, None)


def test_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="cannot read --chat-template-file"):
        chosen_template(None, tmp_path / "missing.jinja")
