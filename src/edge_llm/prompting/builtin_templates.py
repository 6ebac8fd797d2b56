"""The chat templates `--chat-template NAME` names, as llama-server's built-in list calls them, written in Jinja
(rendered in the same sandbox as a model's own template: prompting/chat_template.py), and the choice between a
name, a Jinja string (`--chat-template`) and a file (`--chat-template-file`), checked before the server starts."""

from __future__ import annotations

from pathlib import Path

from edge_llm.prompting.chat_template import FALLBACK_TEMPLATE, ChatTemplate, TemplateError

# A system message goes into the first user turn where the format has no system role (gemma, llama2).
_LLAMA2 = (
    "{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% endif %}{% endfor %}"
    "{% set ns.first = true %}"
    "{% for m in messages %}{% if m['role'] == 'user' or m['role'] == 'tool' %}"
    "{{ bos_token }}[INST] {% if ns.first and ns.system %}<<SYS>>\n{{ ns.system }}\n<</SYS>>\n\n{% endif %}"
    "{{ m['content'] | trim }} [/INST]{% set ns.first = false %}"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}"
)
_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_GEMMA = (
    "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] | trim) + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else 'user' }}\n"
    "{% if m['role'] != 'assistant' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_MISTRAL_V7 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT] {{ m['content'] }}"
    "[/SYSTEM_PROMPT]{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}"
    "{% else %}[INST] {{ m['content'] }}[/INST]{% endif %}{% endfor %}"
)
_PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_ZEPHYR = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": FALLBACK_TEMPLATE, "gemma": _GEMMA, "llama2": _LLAMA2, "llama3": _LLAMA3, "mistral-v7": _MISTRAL_V7,
    "phi3": _PHI3, "zephyr": _ZEPHYR,
}

_PROBE = "edge-llm template probe"


def chosen_template(value: str | None, path: Path | None) -> str | None:
    """The Jinja source --chat-template (a built-in name or a Jinja string) or --chat-template-file gives, or None
    (the model's own). Raises TemplateError with the line to show when it cannot serve: an unreadable file, a
    template that does not compile, fails on a plain conversation or does not put the messages in the prompt (a
    misspelt name is taken for a Jinja string, and then says so)."""
    if path is not None:
        try:
            source = path.expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"cannot read --chat-template-file {path}: {exc}") from None
        where = f"--chat-template-file {path}"
    elif value is not None:
        source, where = BUILTIN_TEMPLATES.get(value, value), "--chat-template"
    else:
        return None
    names = ", ".join(BUILTIN_TEMPLATES)
    try:
        template = ChatTemplate(source)
    except TemplateError as exc:
        raise TemplateError(f"{where}: {exc} (a built-in name is one of {names})") from None
    try:  # a user turn alone: some templates refuse a system role, and that is theirs to do
        rendered = template.render([{"role": "user", "content": _PROBE}])
    except TemplateError as exc:
        raise TemplateError(f"{where} fails on a conversation of one user message: {exc}") from None
    if not any(segment.is_content and segment.text == _PROBE for segment in rendered):
        raise TemplateError(f"{where} is neither a built-in template name ({names}) nor a Jinja chat template "
                            "that writes the messages' content into the prompt")
    return source
