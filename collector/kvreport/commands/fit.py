"""``kvreport fit``: print the fit report (text or ``--json``); the numbers are :func:`kvreport.fit.fit_from_options`."""

from __future__ import annotations

import json

import click

from kvreport.fit import fit_from_options, render_fit


def cli_fit(model_path=None, log_path=None, hf_config=None, ctx_size=None, free_mib=None, parallel=None,
            kv_unified=None, cache_type_k=None, cache_type_v=None, swa_full=False, headroom_mib=None,
            as_json=False, **_ignored) -> int:
    """`kvreport fit`: print the fit report (text or ``--json``); exit 0."""
    rep, shape = fit_from_options(model_path, log_path, hf_config, ctx_size, free_mib, parallel, kv_unified,
                                  cache_type_k, cache_type_v, swa_full, headroom_mib)
    if as_json:
        click.echo(json.dumps(rep, indent=2, sort_keys=False))
    else:
        click.echo(render_fit(rep, shape))
    return 0
