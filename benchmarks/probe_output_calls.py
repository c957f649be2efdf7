"""GPU time of each output-kernel call in one forward+backward of a family op (synchronized around each call),
with the widths of its q, k, v roles and the dtypes: finds which pass of which op is slow.

    PYTHONPATH=. python3 benchmarks/probe_output_calls.py"""
import torch, ula, time
import ula.core.triton.output as O, ula.core.triton.chunk as Ch, ula.core.triton.backward as Bw
from ula.bench import families as fam
orig=O.chunk_output
rec=[]
def wrap(q,k,v,b,c,border,h0,scale,layout,reverse,dot,out_dtype=torch.float32,**kw):
    torch.cuda.synchronize(); t=time.perf_counter()
    r=orig(q,k,v,b,c,border,h0,scale,layout,reverse,dot,out_dtype,**kw)
    torch.cuda.synchronize(); rec.append((tuple(q.shape[-1:]),tuple(k.shape[-1:]),tuple(v.shape[-1:]),str(q.dtype)[6:],str(v.dtype)[6:],str(border.dtype)[6:],dot,kw.get("state_transposed",False),round((time.perf_counter()-t)*1e3,3)))
    return r
Ch.chunk_output=wrap; Bw.chunk_output=wrap
for op in ("mlstm_sig","mlstm_exp","linear","normalized"):
    fn,args=fam.as_args(fam.ours(op),fam.make(op,2,8192,16,128,128,"cuda",torch.bfloat16))
    for it in range(3):
        rec.clear(); o=fn(*args); o.float().sum().backward()
    print(op); [print("  ",r) for r in rec]
