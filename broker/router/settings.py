"""What the operator set: the configuration, the access rules and who may connect, from
control.db and from the hot-reloaded files in the data directory (config.json,
access-rules.json, auth.json; broker/watch.py says when they change).

A bad file is reported (`file_errors`, shown by ``relay status``) and never
half-applied: a bad config.json or auth.json keeps the last good one in force; a bad
access-rules.json denies every publish until it is fixed or removed (fail closed).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from broker.auth import AuthPolicy
from broker.control import ControlPlane
from broker.rules import RuleSet
from broker.watch import AUTH_FILE, CONFIG_FILE, RULES_FILE
from sdk.errors import InvalidConfig, RelayError
from sdk.types import AccessRule, RuleAction

log = logging.getLogger("relay.router")

_DENY_ALL = AccessRule(">", ">", RuleAction.DENY, priority=2**31)


class Settings:
    def __init__(self, root: Path, control: ControlPlane, owner_uid: int) -> None:
        self.root = root
        self.control = control
        self.owner_uid = owner_uid
        self.config: dict[str, Any] = control.get_config()
        self.rules = RuleSet(control.list_rules())
        self.auth = AuthPolicy(owner_uid)  # the owner only, until auth.json is read
        self.file_errors: dict[str, str] = {}  # file name -> why it was refused

    # ------------------------------------------------------------------ changes by request

    def set_config(self, partial: dict[str, Any]) -> dict[str, Any]:
        self.config = self.control.set_config(partial)
        return self.config

    def add_rule(self, rule: AccessRule) -> AccessRule:
        added = self.control.add_rule(rule)
        self._reload_rules()
        return added

    def remove_rule(self, sender: str, subject: str) -> bool:
        removed = self.control.remove_rule(sender, subject)
        self._reload_rules()
        return removed

    def _reload_rules(self) -> None:
        if RULES_FILE not in self.file_errors:  # a broken rules file keeps denying
            self.rules = RuleSet(self.control.list_rules())

    # ------------------------------------------------------------------ the files

    def load(self, names: set[str], *, only_if_changed: bool = False) -> bool:
        """Apply config.json / access-rules.json among ``names``; True if the
        configuration changed.

        At start (``only_if_changed``) a file identical to the one last applied is
        skipped: control.db already holds it, plus any change made since through the
        CLI or the SDK, which a blind re-apply would undo.
        """
        config_changed = False
        loaders = {CONFIG_FILE: self._load_config_file, RULES_FILE: self._load_rules_file}
        for name in sorted(names & loaders.keys()):
            path = self.root / name
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                self._file_removed(name)
                continue
            except OSError as exc:
                digest = f"unreadable: {exc}"
            if only_if_changed and self.control.applied_digest(name) == digest:
                continue
            if loaders[name]():
                self.control.set_applied_digest(name, digest)
                config_changed |= name == CONFIG_FILE
        return config_changed

    def load_auth(self) -> AuthPolicy | None:
        """auth.json as the new policy, or None when it is refused: a bad file keeps the
        last good policy (at start: the owner only), so a typo never opens the door."""
        try:
            if (self.root / AUTH_FILE).exists():
                policy = AuthPolicy.from_json(self._read_json(AUTH_FILE), self.owner_uid)
            else:
                policy = AuthPolicy(self.owner_uid)
        except RelayError as exc:
            self.file_errors[AUTH_FILE] = str(exc)
            log.error("%s refused, the last good policy stays in force: %s", AUTH_FILE, exc)
            return None
        self.auth = policy
        self.file_errors.pop(AUTH_FILE, None)
        log.info("%s applied: %d uids, %d keys", AUTH_FILE, len(policy.uids), len(policy.keys))
        return policy

    def _file_removed(self, name: str) -> None:
        """A deleted file changes nothing, except that a refused one no longer counts: what
        was last applied (control.db, kept through CLI and SDK changes) is in force again.
        For the rules that ends the deny-everything a broken rules file meant."""
        if self.file_errors.pop(name, None) is None:
            return
        if name == RULES_FILE:
            self.rules = RuleSet(self.control.list_rules())
        log.info("%s (refused) was removed: the settings last applied, in control.db, hold", name)

    def _read_json(self, name: str) -> Any:
        try:
            return json.loads((self.root / name).read_bytes())
        except (OSError, ValueError) as exc:
            raise InvalidConfig(f"{name} is not valid JSON: {exc}") from None

    def _load_config_file(self) -> bool:
        try:
            self.config = self.control.replace_config(self._read_json(CONFIG_FILE))
        except RelayError as exc:
            self.file_errors[CONFIG_FILE] = str(exc)
            log.error(
                "%s refused, the last good configuration stays in force: %s", CONFIG_FILE, exc
            )
            return False
        self.file_errors.pop(CONFIG_FILE, None)
        log.info("%s applied", CONFIG_FILE)
        return True

    def _load_rules_file(self) -> bool:
        try:
            data = self._read_json(RULES_FILE)
            if isinstance(data, dict):
                data = data.get("rules")
            if not isinstance(data, list):
                raise InvalidConfig(f'{RULES_FILE} must be a list of rules (or {{"rules": [...]}})')
            rules = [AccessRule.from_wire(r, path=f"rules[{i}]") for i, r in enumerate(data)]
            self.rules = RuleSet(self.control.replace_rules(rules))
        except RelayError as exc:
            # Fail closed: a rules file that cannot be read must not mean "allow everything".
            self.rules = RuleSet([_DENY_ALL])
            self.file_errors[RULES_FILE] = (
                f"{exc}; denying every publish until it is fixed or removed (removed, the "
                "rules last applied, kept in control.db, hold again)"
            )
            log.error("%s refused: %s", RULES_FILE, self.file_errors[RULES_FILE])
            return False
        self.file_errors.pop(RULES_FILE, None)
        log.info("%s applied: %d rules", RULES_FILE, len(self.rules))
        return True
