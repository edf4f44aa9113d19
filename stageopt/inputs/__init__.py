"""Reading the files users edit: strict schemas that turn YAML mappings into frozen dataclasses.

Owns the rules every config reader shares (unknown and missing keys, types,
ranges, duplicate keys), so a model, hardware, framework or space file fails
the same way on the same mistake. Imports only ``stageopt.errors``.
"""
