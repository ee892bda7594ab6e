"""Alembic environment: runs on the connection `lib.db.migrate` hands over, or on the URL it sets."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import lib.models  # noqa: F401  (registers every table on SQLModel.metadata)
from lib.search import is_search_index_object

config = context.config
target_metadata = SQLModel.metadata


def include_name(name, _type, _parent_names) -> bool:  # type: ignore[no-untyped-def]
    """Autogenerate leaves the search index (FTS5 tables, trigram indexes) alone: migration-built."""
    return not is_search_index_object(name)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
