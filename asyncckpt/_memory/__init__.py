"""Host memory the other rooms share: page-aligned buffers and their copies (:mod:`.buffers`),
the process's pool of touched buffers (:mod:`.pool`), the table of keys to file records
(:mod:`.keytable`) and NUMA nodes through libnuma (:mod:`.numa`). It imports nothing else of
the package but its errors."""
