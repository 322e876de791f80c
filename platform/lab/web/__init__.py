"""Browser pages: plain Django templates over the same services as the API."""
