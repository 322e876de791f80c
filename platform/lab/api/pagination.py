"""Pagination of every API list: ``?limit=&offset=``, both bounded.

DRF's LimitOffsetPagination has no default ceiling and answers a limit it
cannot parse by falling back silently; here a limit above ``MAX_LIMIT`` is
clamped to it (a client asking for "everything" gets the largest page and the
``next`` link), and a limit or offset that is not a plain ASCII whole number
(``1e20``, ``-1``, ``²``) is a 400 naming the parameter.
"""

from __future__ import annotations

import re

from rest_framework.pagination import LimitOffsetPagination

from trainer.errors import FieldError

MAX_LIMIT = 500
MAX_OFFSET = 10**9
_WHOLE_NUMBER = re.compile(r"[0-9]{1,12}")


def _whole_number(request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not _WHOLE_NUMBER.fullmatch(raw):
        raise FieldError([(name, f"{name} must be a whole number from 0 to {MAX_OFFSET}")])
    return int(raw)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _whole_number(request, self.limit_query_param)
        if limit is None:
            return self.default_limit
        if limit == 0:
            raise FieldError([(self.limit_query_param, "limit must be at least 1")])
        return min(limit, self.max_limit)

    def get_offset(self, request):
        offset = _whole_number(request, self.offset_query_param)
        if offset is None:
            return 0
        if offset > MAX_OFFSET:
            raise FieldError([(self.offset_query_param, f"offset is at most {MAX_OFFSET}")])
        return offset
