"""Model files as designers export them, checked and normalised before trimesh reads them.

A layer below `render` (which loads scenes through it) that `signaling` may import too: the
upload checks (`upload_file`) run where a file arrives and again where a worker loads it; the
prepasses (`gltf_prepass`, with `gltf_checks` and `gltf_document`; `obj_prepass`) run in
`render.scene_files.load_scene` just before trimesh.
"""
