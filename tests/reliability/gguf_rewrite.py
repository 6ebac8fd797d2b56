"""Copies a GGUF model with another `tokenizer.chat_template` or other flags, through the `gguf` package's reader and
writer."""

from __future__ import annotations

from pathlib import Path

import gguf

TEMPLATE_KEY = gguf.Keys.Tokenizer.CHAT_TEMPLATE


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    """Writes `target`: every key-value and tensor of `source`, with `template` as the chat template."""
    return rewritten(source, target, chat_template=template)


def rewritten(source: Path, target: Path, *, chat_template: str | None = None,
              flags: dict[str, bool] | None = None) -> Path:
    """Writes `target`: every key-value and tensor of `source`, with `chat_template` (when given) as the chat
    template and each of `flags` set (a key without the architecture prefix: "attention.causal")."""
    reader = gguf.GGUFReader(source)
    architecture = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    replaced = {f"{architecture}.{key}": value for key, value in (flags or {}).items()}
    writer = gguf.GGUFWriter(target, architecture, endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            # The writer adds the architecture and the GGUF.* header fields itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            if (chat_template is not None and field.name.startswith(TEMPLATE_KEY)) or field.name in replaced:
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
        for key, value in replaced.items():
            writer.add_bool(key, value)
        for tensor in reader.tensors:
            writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes,
                                   tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    finally:
        writer.close()
    return target
