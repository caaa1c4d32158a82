-- A row sent again updates its `sync.held` row in place: the new version
-- lands on the same page (a HOT update, no index written) only when the page
-- has room for it. Packed full, every such update moved the row and wrote
-- both indexes again. Pages written from now on keep a fifth free.
ALTER TABLE sync.held SET (fillfactor = 80);
