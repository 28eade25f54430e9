"""Deploy configuration: the typed model (`deploy`), the loader (`loader`: layers merged, read
strictly, CLI refits), the layer stacking (`layers`), the strict reader (`reader`), the shared
value checks (`validators`) and the shipped profiles (`profiles/*.yaml`, package data).

Pure Python, no torch: the bottom layer of the package, importable from everywhere."""
