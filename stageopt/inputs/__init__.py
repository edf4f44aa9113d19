"""Reading the files users edit. Owns one gate for bytes and documents, bounds on sizes, strict schemas.

``gate`` reads every user file (encoding, size, YAML alias expansion and
nesting, JSON constants, duplicate keys); ``limits`` bounds sizes by what a
real system can have and states the bound in the error; ``names`` confines
names that become paths to one component; ``schema`` turns YAML mappings into
frozen dataclasses (unknown and missing keys, types, ranges), so a model,
hardware, framework or space file fails the same way on the same mistake.
Imports only ``stageopt.errors``.

Why not pydantic (issue 15 suggests it): the gate's work happens before any
schema runs — on bytes, on the YAML node graph before objects are built, on
JSON constants — where pydantic has no hook, so it would not make the gate
smaller. For the schema layer, the typed frozen dataclasses here already give
one line naming the file, key, value and bound, and are the config classes of
several packages; pydantic would add a dependency and a second object model
for the same checks. What it would add (every error at once, a JSON Schema for
editors) is worth revisiting with the schema layer as a whole.
"""
