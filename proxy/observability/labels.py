"""The model label of the metrics: the name of a model the proxy knows, else `other`.

Model names come from clients, and every name a label takes is one more series of each
request metric in every replica: only names the config or the model map gives are used.
A request's model is labelled

1. by its own name, when a per-model override (`models[].match`) or a route (`routes[].model`)
   names it exactly;
2. by the name litellm's model map knows it by (`ModelCatalog.name`: the map's own key, after
   provider prefixes and snapshot dates are tried off; for an upstream of kind litellm, also
   the provider's model it is sent as);
3. by the glob of the first override, then route, that matches it (`claude-*`; never `*`);
4. else `other`.

At most `MAX_MODELS` names are used by one process, the first that come: past that, `other`
too, so that a client cycling through the model map cannot multiply the series.
"""

from __future__ import annotations

import fnmatch

from proxy.config import Config, Upstream
from proxy.models.catalog import ModelCatalog
from proxy.models.limits import MAX_MEMOISED

OTHER = "other"
MAX_MODELS = 50
_GLOB = frozenset("*?[")


class ModelLabels:
    """`label(model, upstream)`, memoised per model name and upstream."""

    def __init__(self, config: Config, catalog: ModelCatalog) -> None:
        self.config = config
        self.catalog = catalog
        named = [o.match for o in config.models] + [r.model for r in config.routes]
        self._exact = frozenset(n for n in named if not _GLOB & set(n))
        self._globs = tuple(n for n in named if _GLOB & set(n) and n != "*")
        self._labels: dict[tuple[str, str], str] = {}
        self._used: set[str] = set()

    def label(self, model: str, upstream: Upstream) -> str:
        key = (model, upstream.name)
        found = self._labels.get(key)
        if found is None:
            found = self._bounded(self._known(model, upstream))
            if len(self._labels) < MAX_MEMOISED:
                self._labels[key] = found
        return found

    def _known(self, model: str, upstream: Upstream) -> str | None:
        if model in self._exact:
            return model
        provider = self.config.provider_model(upstream, model)
        found = self.catalog.name(model) or self.catalog.name(provider)
        return found or next((g for g in self._globs if fnmatch.fnmatchcase(model, g)), None)

    def _bounded(self, name: str | None) -> str:
        if name is None or (name not in self._used and len(self._used) >= MAX_MODELS):
            return OTHER
        self._used.add(name)
        return name
