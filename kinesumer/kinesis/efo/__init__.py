"""Enhanced fan-out transport: registered stream consumers (:mod:`.consumers`) and
SubscribeToShard over HTTP/2 (:mod:`.subscriber`). The reading side lives in ``read/``
(``efo_fetcher``, ``efo_session``).

Importing :mod:`.subscriber` needs the ``efo`` extra (``httpx`` with ``h2``); :mod:`.consumers`
needs only aiobotocore, which the library always has.
"""
