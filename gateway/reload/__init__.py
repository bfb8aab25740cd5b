"""Live reload of the configuration (docs/reload.md).

    plan.py      what a new configuration changes: backends kept, replaced, added, removed,
                 renamed (a new prefix), and settings that only a restart applies
    reloader.py  one reload: load, validate, build, swap the snapshot (Runtime.apply), count
    watch.py     `serve --watch`: the config file polled for a change (stat + content hash)
    metrics.py   the generation, its time, needs-restart (reloads by result: observability)
"""
