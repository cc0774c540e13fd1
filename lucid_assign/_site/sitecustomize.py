"""``lucid-assign run``'s hook in every Python process of the command it starts (lucid_assign/_launch.py puts this
folder first on PYTHONPATH, so that each interpreter imports this file at its start, and names what to patch in
LUCID_ASSIGN_RUN; the launcher's own process, where COMMAND runs in it, loads it as ``_lucid_assign_run``).

It imports nothing beyond ``os`` and ``sys`` and patches nothing at start: it adds an import finder that, when a
trainer's module (or a named matcher's) has been imported for the first time, patches it with lucid-assign's
integration (which imports torch, already imported by then). A process that imports none of them runs as it would
have: this folder leaves ``sys.path`` again, and the ``sitecustomize`` it shadows (if any) runs as usual.
"""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))
# the modules whose first import patches each trainer (lucid_assign.integrations.<trainer>.patch)
_TRAINER_MODULES = {
    "ultralytics": ("ultralytics",),
    "transformers": ("transformers.loss.loss_for_object_detection", "transformers.loss.loss_deformable_detr",
                     "transformers.loss.loss_rt_detr", "transformers.loss.loss_lw_detr",
                     "transformers.loss.loss_rf_detr", "transformers.loss.loss_grounding_dino"),
    "rfdetr": ("rfdetr.models.matcher",),
}


class _Loader:
    """A module's own loader, then the patches its import triggers; the module keeps its own loader afterwards."""

    def __init__(self, inner, finder, name):
        self._inner, self._finder, self._name = inner, finder, name

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        spec = getattr(module, "__spec__", None)
        try:
            self._inner.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._inner
            if spec is not None and spec.loader is self:
                spec.loader = self._inner
        self._finder.fire(self._name)


class _Finder:
    """Finds nothing itself: for a watched module, the spec the other finders give, its loader wrapped."""

    def __init__(self, actions, backend):
        self.actions, self.backend = actions, backend
        self.done = set()
        self._looking = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.actions or name in self._looking or name in _sys.modules:
            return None
        self._looking.add(name)
        try:
            for finder in _sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._looking.discard(name)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, self, name)
        return spec

    def fire(self, name):
        for kind, what in self.actions.get(name, ()):
            if (kind, what) in self.done:
                continue
            self.done.add((kind, what))
            try:
                if kind == "matcher":
                    from lucid_assign.integrations import detr

                    detr.patch(what, self.backend)
                else:
                    import importlib

                    importlib.import_module(f"lucid_assign.integrations.{what}").patch(self.backend)
            except Exception as e:  # the command runs on, unpatched there, and says so
                print(f"lucid-assign run: {what} is not patched in process {_os.getpid()}: {type(e).__name__}: {e}",
                      file=_sys.stderr, flush=True)
            else:
                if _os.environ.get("LUCID_ASSIGN_VERBOSE", "0") not in ("", "0"):
                    print(f"lucid-assign run [pid {_os.getpid()}]: patched {what} at the import of {name}",
                          file=_sys.stderr, flush=True)


def _install():
    spec = _os.environ.get("LUCID_ASSIGN_RUN")
    if not spec:
        return
    settings = dict(part.partition("=")[::2] for part in spec.split(";") if part)
    actions = {}
    for trainer in filter(None, settings.get("trainers", "").split(",")):
        for module in _TRAINER_MODULES.get(trainer, ()):
            actions.setdefault(module, []).append(("trainer", trainer))
    for matcher in filter(None, settings.get("matchers", "").split(",")):
        actions.setdefault(matcher.partition(":")[0], []).append(("matcher", matcher))
    if actions:
        _sys.meta_path.insert(0, _Finder(actions, settings.get("backend") or "auto"))


def _chain():
    """This folder off sys.path, and the sitecustomize it shadowed run in its place."""
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _HERE]
    # importlib.machinery's PathFinder, from the import system's own module (loaded at every start; importing
    # importlib.machinery would add its package's import to every process)
    finder = getattr(_sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    if finder is None:
        from importlib.machinery import PathFinder as finder
    spec = finder.find_spec("sitecustomize", _sys.path)
    if spec is not None and spec.loader is not None:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # a process's start; lucid_assign/_launch.py loads it under another name and installs
    _install()
    _chain()
