"""``python -m services.experience_store`` / ``marti store``: run the experience store server."""

from __future__ import annotations

from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.rpc.serving.logs import configure_logging
from marti.rpc.serving.server import ServiceSpec, run_server
from marti.rpc.settings import given_flags, load_settings, refusals_exit, settings_parser
from marti.types.experience import read_tables_yaml

from .core.storage import MemoryStorage, SqliteStorage
from .core.store import ExperienceStore
from .servicer import SERVICE_NAME, ExperienceServicer
from .settings import StoreSettings


def build_store(settings: StoreSettings) -> ExperienceStore:
    """Open the storage (SQLite under ``data_dir`` or memory), restore it and create the configured tables.

    Raises:
        InvalidArgumentError: for an unreadable or bad tables YAML (naming the file), a bad storage setting, or
            a table config in ``data_dir`` this version refuses (naming the table, the field and value).
        FailedPreconditionError: another store holds ``data_dir``.
    """
    tables = read_tables_yaml(settings.config) if settings.config else []
    storage = (
        SqliteStorage(
            settings.data_dir,
            settings.sqlite_synchronous,
            settings.keep_snapshots,
            page_size=settings.sqlite_page_size,
            group_max_bytes=settings.group_commit_max_bytes,
            checkpoint_mib=settings.wal_checkpoint_mib,
        )
        if settings.data_dir
        else MemoryStorage()
    )
    store = ExperienceStore(
        storage,
        tables,
        default_table=settings.default_table or None,
        max_query_items=settings.max_query_items,
        taken_ids_window=settings.taken_ids_window,
    )
    store.start_snapshots(settings.snapshot_interval_s)
    return store


def make_spec(settings: StoreSettings) -> tuple[ServiceSpec, ExperienceServicer]:
    """Build the store, its servicer and the :class:`ServiceSpec` that hosts it."""
    servicer = ExperienceServicer(build_store(settings), settings)

    async def on_stop() -> None:
        servicer.close()

    spec = ServiceSpec(
        name=SERVICE_NAME,
        add_to_server=lambda s: sgrpc.add_ExperienceServiceServicer_to_server(servicer, s),
        on_stop=on_stop,
    )
    return spec, servicer


def main(argv: list[str] | None = None) -> int:
    """Parse flags (one per :class:`StoreSettings` field), build settings (flags > ``MARTI_STORE_*`` env >
    defaults) and serve until a signal. A bad setting exits with code 2 and one line naming it (:func:`marti.rpc.settings.load_settings`), as does a data dir
    another store holds (:func:`marti.rpc.settings.refusals_exit`).

    Returns:
        Process exit code.
    """
    args = settings_parser(StoreSettings, "marti store", "Run the marti experience store.").parse_args(argv)
    settings = load_settings(StoreSettings, given_flags(args), "marti store")
    configure_logging(settings.log_level)  # restoring the data dir logs, before run_server
    with refusals_exit("marti store"):
        spec, _ = make_spec(settings)
    return run_server([spec], settings)


if __name__ == "__main__":
    raise SystemExit(main())
