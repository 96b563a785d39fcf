"""YAML for config files, refusing a key given twice: PyYAML keeps the last value without a word, so a
file with `learning_rate` twice would train with whichever came last (TOML's parser refuses it already)."""

from __future__ import annotations

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        first_line: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may override on purpose
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in first_line:
                lines = f"lines {first_line[key] + 1} and {key_node.start_mark.line + 1}"
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice ({lines})")
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_yaml(text: str):
    """yaml.safe_load, but a key given twice in one mapping is a yaml.YAMLError naming it and its lines."""
    return yaml.load(text, Loader=_UniqueKeyLoader)
