"""``stageopt export``: a plan (or a study's best.json) as a framework's launch settings.

``stageopt export runs/<study>`` prints the Megatron-LM arguments (or, with
``--to torchtitan``, the torchtitan TOML) of the study's best plan;
``stageopt export --model M --plan P --gpus N`` does the same for any plan.
The plan is validated first, and the framework profile's execution options
(attention kernel, dropout, overlap, optimizer sharding) are part of the output.
Exit codes: 0 written, 2 bad input (file, plan, a setting the framework cannot express).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stageopt.errors import ConfigError
from stageopt.frameworks import load_profile
from stageopt.launch import TARGETS, launch_settings, targets_of
from stageopt.model import ModelSpec, load_model, parse_overrides
from stageopt.parallel.plan import Plan, parse_plan_fields
from stageopt.workload import build_workload

DEFAULT_PROFILE = {"megatron": "megatron-core", "megatron-bridge": "megatron-core", "torchtitan": "torchtitan"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="turn a plan or best.json into Megatron-LM arguments, Megatron-Bridge overrides or a torchtitan TOML",
                       description=__doc__.splitlines()[0])
    p.add_argument("source", nargs="?", metavar="BEST",
                   help="a study's best.json or its run directory (runs/<study>); or give --plan and --model")
    p.add_argument("--rank", type=int, default=1, help="which plan of best.json (1 = best; default 1)")
    p.add_argument("--to", choices=TARGETS, help="framework to export to (default: the plan's framework)")
    p.add_argument("--plan", help='plan string, e.g. "tp=8 pp=4 mbs=1 gbs=1024 zero=1 sp=on"')
    p.add_argument("--model", help="preset, model YAML or config.json (default with BEST: the study space's model)")
    p.add_argument("--set", dest="model_set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field (repeatable)")
    p.add_argument("--space", help="the study's space (name or YAML) when best.json's space is not a shipped one")
    p.add_argument("--gpus", type=int, help="GPU count (with --plan; dp is derived from it when omitted)")
    p.add_argument("--framework", metavar="NAME|FILE", help="framework profile of a --plan that names none")
    p.add_argument("--out", metavar="FILE", help="write the arguments / TOML to FILE instead of stdout")
    p.add_argument("--json", action="store_true", help="print one JSON object (target, settings, notes)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    plan_text, gpus, model = _inputs(args)
    plan = _parse_plan(plan_text, gpus, args.framework, args.to)
    target = args.to or next(iter(targets_of(plan.framework)), None)
    if target is None:
        raise ConfigError(f"framework {plan.framework.name!r} has no export target; give --to "
                          f"{' or --to '.join(TARGETS)}")
    build_workload(model, plan, plan.gpus)  # a plan the simulators would refuse is not exported
    settings = launch_settings(target, model, plan)
    if args.out:
        Path(args.out).write_text(settings.text + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps({"target": target, "model": model.name, "gpus": plan.gpus, "plan": str(plan),
                          "settings": settings.settings, "notes": list(settings.notes),
                          "out": args.out}, indent=1))
        return 0
    if not args.out:
        print(settings.text)
    else:
        print(f"wrote {target} settings for {plan.gpus} GPUs to {args.out}")
    for note in settings.notes:
        print(f"note: {note}")
    return 0


def _inputs(args: argparse.Namespace) -> tuple[str, int | None, ModelSpec]:
    """Plan text, GPU count and model, from best.json or from --plan/--model/--gpus."""
    if args.source and args.plan:
        raise ConfigError("export: give either BEST (a best.json or run directory) or --plan, not both")
    if args.plan:
        if not args.model:
            raise ConfigError("export --plan needs --model (a preset, model YAML or config.json)")
        return args.plan, args.gpus, load_model(args.model, args.model_set)
    if not args.source:
        raise ConfigError("export: give a study's best.json (or runs/<study>), or --plan with --model")
    best, record = _best_record(Path(args.source), args.rank)
    if args.model:
        model = load_model(args.model, args.model_set)
    else:
        model = _space_model(args.space or best.get("space"), args.source, args.model_set)
    return str(record["plan"]), int(record["gpus"]), model


def _best_record(source: Path, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    path = source / "best.json" if source.is_dir() else source
    try:
        best = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"export: {path} not found; give a best.json or a run directory that has one "
                          "(stageopt report runs/<study> rebuilds it)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"export: cannot read {path} as JSON ({err}); give a best.json written by stageopt") from None
    plans = best.get("best") if isinstance(best, dict) else None
    if not isinstance(plans, list) or not plans:
        raise ConfigError(f"export: {path} lists no feasible plan under 'best'; run a search that finds one first")
    if not 1 <= rank <= len(plans):
        raise ConfigError(f"export --rank {rank}: {path} has {len(plans)} plan(s); give 1..{len(plans)}")
    record = plans[rank - 1]
    if not isinstance(record, dict) or "plan" not in record or "gpus" not in record:
        raise ConfigError(f"export: entry {rank} of {path} has no 'plan' and 'gpus'; give a best.json written by stageopt")
    return best, record


def _space_model(space: object, source: str, model_set: list[str]) -> ModelSpec:
    """The model of the study's space (with the space's own overrides), plus the user's ``--set``."""
    from stageopt.search.space import load_space

    if not isinstance(space, str) or not space:
        raise ConfigError(f"export: {source} does not name its space; pass --model (and --set seq=...)")
    try:
        loaded = load_space(space)
    except ConfigError:
        raise ConfigError(f"export: {source} was searched on space {space!r}, which is not a shipped space; "
                          "pass --space FILE or --model (and --set seq=...)") from None
    return loaded.model.replace(**parse_overrides(model_set)) if model_set else loaded.model


def _parse_plan(text: str, gpus: int | None, framework: str | None, target: str | None) -> Plan:
    named = parse_plan_fields(text).get("framework")
    if named is None and framework is None and target is not None:
        framework = DEFAULT_PROFILE[target]
    plan = Plan.parse(text, gpus=gpus, framework=load_profile(framework) if framework else None)
    runs_on = targets_of(plan.framework)
    if target is not None and runs_on and target not in runs_on:
        raise ConfigError(f"export --to {target}: the plan was simulated on framework={plan.framework.name}, whose "
                          f"defaults differ; simulate or search it with --framework {DEFAULT_PROFILE[target]} first, "
                          f"or export --to {runs_on[0]}")
    return plan
