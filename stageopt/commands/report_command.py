"""``stageopt report runs/<study>``: rebuild best.json, trials.csv and the plots from a study's storage."""

from __future__ import annotations

import argparse
from pathlib import Path

from stageopt.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="rebuild a search's best.json, trials.csv and plots from storage",
                       description=__doc__.splitlines()[0])
    p.add_argument("run_dir", help="runs/<study> folder (its journal.log, or --storage)")
    p.add_argument("--storage", help="RDB URL the study lives in (default: RUN_DIR/journal.log)")
    p.add_argument("--study-name", help="default: the folder's name")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", action="store_true", help="print best.json's content")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import optuna

    from stageopt.hardware.presets import ranking_accuracy
    from stageopt.search.artifacts import SUMMARY_ATTR, render_table, stored_summary, study_best, write_report
    from stageopt.search.objective import objectives_for
    from stageopt.search.session import META_ATTR
    from stageopt.search.storage import JOURNAL_NAME, open_storage, study_exists

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_dir = Path(args.run_dir)
    if args.storage is None and not (run_dir / JOURNAL_NAME).is_file():
        raise ConfigError(f"{run_dir}: no {JOURNAL_NAME} here; give a runs/<study> folder or --storage URL")
    storage = open_storage(args.storage, run_dir, write=False).storage
    names = [s.study_name for s in storage.get_all_studies()]
    name = args.study_name or (run_dir.name if run_dir.name in names else (names[0] if len(names) == 1 else None))
    if name is None or not study_exists(storage, name):
        raise ConfigError(f"{run_dir}: study {name or run_dir.name!r} not found (studies: {', '.join(names) or 'none'}); "
                          "pass --study-name")
    study = optuna.load_study(study_name=name, storage=storage)
    meta = study.user_attrs.get(META_ATTR)
    if not isinstance(meta, dict):
        raise ConfigError(f"study {name!r} was not created by 'stageopt search'")
    objectives = objectives_for(tuple(meta["objectives"]))
    head = stored_summary(study, study.user_attrs.get(SUMMARY_ATTR), run_dir, meta)
    files = write_report(study, run_dir, objectives, meta["backend"], head, plots=not args.no_plots)
    best = study_best(study, objectives, meta["backend"])
    if args.json:
        print((run_dir / "best.json").read_text().strip())
        return 0
    print(f"study {name}: {len(study.trials)} trials")
    print(render_table(best, objectives))
    if best:
        print(f"accuracy: {ranking_accuracy(best[0].record['hardware'])}")
    print("wrote " + ", ".join(Path(f).name for f in files.written))
    for note in files.notes:
        print(f"note: {note}")
    return 0
