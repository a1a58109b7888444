"""runtime/paging: execution over relations and fields larger than memory: page plans,
page buffers and loaders, the page writer, degrees by row ranges."""
