"""Endpoints found by discovery sources (``discovery:``) rather than typed in ``endpoints:``.

:mod:`~kvwatch.discovery.formats` parses lists, :mod:`~kvwatch.discovery.endpoints` makes
them endpoints with a source's template, :mod:`~kvwatch.discovery.sources` fetches them and
:mod:`~kvwatch.discovery.loop` keeps each source's last good list.
"""
