"""The head explorer as a notebook widget (anywidget: Jupyter, VS Code, Colab).

    widget = headprobe.explore(results)      # or a results directory; display it in a cell
    widget.head                              # "L-H" of the head last selected in it ("" before)
    widget.head = "3-7"                      # selects it in the view

Built from the same ES module as the report (`explorer.js`, its `render` export) and the same
data (`explorer_data`, synced as the `data` trait). Where widgets cannot be shown (no anywidget,
a static renderer), it is the report's self-contained HTML fragment (`_repr_html_`).
"""

from __future__ import annotations

from headprobe.report.explorer import explorer_data, explorer_html, script


class StaticExplorer:
    """The fallback: the explorer's self-contained HTML, no kernel round trip (`head` stays "")."""

    def __init__(self, data: dict):
        self.data, self.head = data, ""

    def _repr_html_(self) -> str:
        return explorer_html(self.data, element_id="head-explorer-static")


def _widget_class():
    import anywidget
    import traitlets

    class Explorer(anywidget.AnyWidget):
        """The explorer widget: `data` (the explorer's data), `head` ("L-H", set by a selection)."""

        _esm = script()
        data = traitlets.Dict().tag(sync=True)
        head = traitlets.Unicode("").tag(sync=True)

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
            data = dict(data or {})
            data["text/html"] = self._repr_html_()
            return data, metadata

        def _repr_html_(self) -> str:
            return explorer_html(self.data, element_id=f"head-explorer-{self.model_id[:8]}")

    return Explorer


def explore(results):
    """The explorer of `results` (a `Results` or a results directory) as a widget, or, without
    anywidget, as `StaticExplorer` (HTML)."""
    from headprobe.report import read_results

    results, _ = read_results(results)
    data = explorer_data(results)
    try:
        explorer = _widget_class()
    except ImportError:
        return StaticExplorer(data)
    return explorer(data=data)
