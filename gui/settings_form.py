"""Form fields made from the engine's settings schema (`engine.config.schema`).

A `SettingField` is one config field as a widget: its kind (switch, choice, text, whole
or decimal number) from the field's type, its range from the field's bounds, its label and
tooltip from the field's label and help, and the command line it sends from the field's
flag. The window thus offers what the CLI offers, by the same names and rules.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QSpinBox,
    QToolTip,
    QWidget,
)

from engine.config.schema import (
    default_of,
    field_help,
    flag_of,
    label_of,
    rules,
    value_type,
)

#: the top of a number's range where its setting has no upper bound
_NO_TOP = 10_000_000


class SettingField:
    """One config setting (field `name` of section `cls`) as a form widget."""

    def __init__(self, cls: type, name: str, *, words: dict[str, tuple[str, str]] | None = None,
                 widget: QWidget | None = None, decimals: int = 3, unset: str = "") -> None:
        """`unset`: a number's words for "not given" (None: the engine's, or the model's,
        own), shown one step below its range."""
        self.cls, self.name = cls, name
        self.unset = unset
        self.rule = rules(cls)[name]
        self.kind = value_type(cls, name)
        self.label = label_of(cls, name)
        self.flag = flag_of(cls, name)
        self.default = default_of(cls, name)
        self.widget = widget if widget is not None else self._make(words or {}, decimals)
        if isinstance(self.widget, QDoubleSpinBox | QSpinBox):
            self._bound(self.widget, given=widget is not None)
            if self.rule.unit and widget is None:
                self.widget.setSuffix(f" {self.rule.unit}")
            if unset:
                spin = self.widget
                spin.setMinimum(spin.minimum() - spin.singleStep() if isinstance(spin, QSpinBox)
                                else spin.minimum() - 10.0 ** -spin.decimals())
                spin.setSpecialValueText(unset)
                spin.setValue(spin.minimum())
        #: what the field said of the last value typed out of its range ("" once in it):
        #: a spin box puts its last good value back without a word
        self.problem = ""
        if isinstance(self.widget, QDoubleSpinBox | QSpinBox):
            self.widget.lineEdit().textEdited.connect(self._typed)
        if not self.widget.toolTip():
            self.widget.setToolTip(field_help(cls).get(name, ""))
        if self.default is not None:
            self.set_value(self.default)

    def _make(self, words: dict[str, tuple[str, str]], decimals: int) -> QWidget:
        if self.kind is bool:
            return QCheckBox(self.label)
        if self.rule.choices:
            box = QComboBox()
            for i, value in enumerate(self.rule.choices):
                text, tip = words.get(value, (value, ""))
                box.addItem(text, value)
                box.setItemData(i, tip, Qt.ItemDataRole.ToolTipRole)
            box.setSizeAdjustPolicy(
                QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            box.setMinimumContentsLength(14)
            return box
        if self.kind is str:
            return QLineEdit()
        if self.kind is int:
            return QSpinBox()
        spin = QDoubleSpinBox()
        spin.setDecimals(decimals)
        return spin

    def _bound(self, spin: QDoubleSpinBox | QSpinBox, given: bool) -> None:
        """The widget's range: the field's bounds (an open bound one step inside); a widget
        made elsewhere (a learning rate's) keeps its own range inside them."""
        rule = self.rule
        step = 1 if isinstance(spin, QSpinBox) else 10.0 ** -spin.decimals()
        low = rule.low if rule.low is not None else -_NO_TOP
        high = rule.high if rule.high is not None else _NO_TOP
        low += step if rule.low_open else 0
        high -= step if rule.high_open else 0
        if given:
            low, high = max(low, spin.minimum()), min(high, spin.maximum())
        if isinstance(spin, QSpinBox):
            spin.setRange(int(low), int(min(high, 2**31 - 1)))
        else:
            spin.setRange(low, high)

    def _typed(self, _text: str) -> None:
        """A number typed out of the setting's range is said at the field, in the engine's
        words for its rule (`Setting.problem`), with the value the box keeps."""
        spin = self.widget
        assert isinstance(spin, QDoubleSpinBox | QSpinBox)
        try:
            typed = float(spin.cleanText().replace(",", "."))
        except ValueError:
            return  # half typed ("-", "1e"): the box says nothing until it is a number
        value: Any = int(typed) if self.kind is int and typed.is_integer() else typed
        why = self.rule.problem(value)
        if why is None and not spin.minimum() <= typed <= spin.maximum():
            why = f"must be from {self.text(spin.minimum())} to {self.text(spin.maximum())}"
        self.problem = "" if why is None else (
            f"{self.label} {why}; it stays {self.text(self.value())}.")
        if self.problem:
            QToolTip.showText(spin.mapToGlobal(spin.rect().bottomLeft()), self.problem, spin)
        else:
            QToolTip.hideText()

    def value(self) -> Any:
        w = self.widget
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentData()
        if isinstance(w, QLineEdit):
            return w.text().strip()
        if self.unset and w.value() == w.minimum():  # type: ignore[attr-defined]
            return None
        if isinstance(w, QSpinBox):
            return int(w.value())
        assert isinstance(w, QDoubleSpinBox)
        return float(w.value())

    def set_value(self, value: Any) -> None:
        """Show `value` (one of the wrong type or out of the field's choices is left out)."""
        w = self.widget
        if isinstance(w, QCheckBox):
            w.setChecked(bool(value))
        elif isinstance(w, QComboBox):
            i = w.findData(value)
            if i >= 0:
                w.setCurrentIndex(i)
        elif isinstance(w, QLineEdit):
            if isinstance(value, str):
                w.setText(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            w.setValue(value)  # type: ignore[attr-defined]
        elif value is None and self.unset:
            w.setValue(w.minimum())  # type: ignore[attr-defined]

    def text(self, value: Any) -> str:
        return f"{value:.6g}" if isinstance(value, float) else str(value)

    def args(self, always: bool = False) -> list[str]:
        """The flags that send the form's value: none when it is the field's default
        (the engine, or the voice's own setting, decides) unless `always`."""
        value = self.value()
        if value == self.default and not always:
            return []
        if self.kind is bool:
            return [self.flag if value else "--no-" + self.flag[2:]]
        return [self.flag, self.text(value)]
