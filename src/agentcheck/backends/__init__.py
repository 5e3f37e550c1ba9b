"""Database backends: connections, migrations and all of the SQL, one module per database."""
