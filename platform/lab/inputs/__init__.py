"""Input from users, parsed in one place for the REST API, the tracking API and
the pages: query strings (``query``: one pydantic model per endpoint, repeated
keys as lists, errors by field) and JSON text (``json_input``: depth-bounded,
no non-finite literals). Bad input is a ``FieldError`` or a ``ValueError``
naming what is wrong, never a 500."""
