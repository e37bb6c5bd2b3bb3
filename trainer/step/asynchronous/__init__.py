"""The async mode: `AsyncUpdate` (`async_update`), its tower threads (`threads`), a window's records
(`window`), the towers' graph code (`graph`) and the staleness gate (`gate`)."""
