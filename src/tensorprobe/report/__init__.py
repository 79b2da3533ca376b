"""Renderers: findings are data (frozen dataclasses with `to_dict()`); these modules turn them into a
terminal table (`terminal`), a self-contained HTML page (`html`) or JSON (`to_dict` + `cli._common.emit_json`)."""
