"""Copies a GGUF model with another `tokenizer.chat_template`, through the `gguf` package's reader and writer."""

from __future__ import annotations

from pathlib import Path

import gguf

TEMPLATE_KEY = gguf.Keys.Tokenizer.CHAT_TEMPLATE


def with_chat_template(source: Path, target: Path, template: str) -> Path:
    """Writes `target`: every key-value and tensor of `source`, with `template` as the chat template."""
    reader = gguf.GGUFReader(source)
    architecture = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    writer = gguf.GGUFWriter(target, architecture, endianess=reader.endianess)
    try:
        for field in reader.fields.values():
            # The writer adds the architecture and the GGUF.* header fields itself.
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            if field.name.startswith(TEMPLATE_KEY):
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
        writer.add_chat_template(template)
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


def chat_template_of(path: Path) -> str | None:
    field = gguf.GGUFReader(path).get_field(TEMPLATE_KEY)
    return None if field is None else str(field.contents())
