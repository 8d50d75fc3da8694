"""Source-vs-lake verification (`lakestream verify`): is every captured table mirrored exactly in Iceberg? Driver
side: one Spark action per table compares the source, read in one consistent snapshot, with its mirror.

- `compare`: `verify_tables` and its report; the PostgreSQL source, the canonical form and the comparison.
- `mariadb`: a MariaDB source's columns and its mirror's in one canonical form, for `compare` to join.
"""
