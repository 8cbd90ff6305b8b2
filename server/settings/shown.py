"""How secrets appear in a JSON dump of the settings: masked (`palaestra config`, logs),
except in the settings a cluster front hands its workers (`context={"secrets": True}`,
server/cluster/worker.py `settings_for_workers`), which must work as they are."""

from __future__ import annotations

from pydantic import FieldSerializationInfo, SecretStr

MASK = "**********"


def reveals(info: FieldSerializationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get("secrets") is True


def secret_shown(value: SecretStr | None, info: FieldSerializationInfo) -> str | None:
    if value is None:
        return None
    return value.get_secret_value() if reveals(info) else MASK
