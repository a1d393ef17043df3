#!/usr/bin/env python3
# A CPU emulation of k_mma.cu's loads and fragment registers (as of the commit that adds it), used before the kernel's
# first GPU run: each lane's registers are filled from memory exactly as k_mma_linear fills them, the MMA is defined
# by the PTX ISA fragment layouts for m16n8k32 .e4m3 (A: a0 = A[g][4q+i], a1 = A[g+8][4q+i], a2 = A[g][16+4q+i],
# a3 = A[g+8][16+4q+i]; B: b0 = B[4q+i][g], b1 = B[16+4q+i][g]; D: d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q],
# d3 = D[g+8][2q+1]), the FP4 -> E4M3 conversion is the prmt sequence, and the result for every tile shape
# (MT, NT, U) must equal the exact dot product on small-integer data (FP8 and FP4, partial FP4 chunks, rows and
# tokens not multiples of the tile, a view with row0 != 0). Pure Python, ~10 s. If k_mma.cu's loads change, change
# this with them. Usage: tools/gpu/mma_emulate.py
import random, struct
def e4m3(b):
    e=(b>>3)&15; m=b&7
    v= m*2**-9 if e==0 else (1+m/8)*2**(e-7)
    return -v if b&0x80 else v
def e2m1(c):
    e=(c>>1)&3; m=c&1
    v= m*0.5 if e==0 else (1+m/2)*2**(e-1)
    return -v if c&8 else v
def prmt(a,b,c):
    src=[(a>>(8*i))&0xff for i in range(4)]+[(b>>(8*i))&0xff for i in range(4)]
    d=0
    for k in range(4):
        sel=(c>>(4*k))&0xf; byte=src[sel&7]
        if sel&8: byte=0xff if byte&0x80 else 0
        d|=byte<<(8*k)
    return d
def cvt4(v):
    mag=prmt(0x3C383000,0x4C484440,v&0x7777); neg=prmt(0x80808080,0x80808080,v&0xffff)
    return (mag|((neg<<1)&0x80808080))&0xffffffff
def word(buf,off): return buf[off]|buf[off+1]<<8|buf[off+2]<<16|buf[off+3]<<24
def mma(d, A, B):  # A[lane] = 4 regs, B[lane] = 2 regs, d[lane] = 4 floats
    Am=[[0]*32 for _ in range(16)]; Bm=[[0]*8 for _ in range(32)]
    for lane in range(32):
        g,q=lane>>2,lane&3
        for i in range(4):
            Am[g][4*q+i]=e4m3((A[lane][0]>>(8*i))&255); Am[g+8][4*q+i]=e4m3((A[lane][1]>>(8*i))&255)
            Am[g][16+4*q+i]=e4m3((A[lane][2]>>(8*i))&255); Am[g+8][16+4*q+i]=e4m3((A[lane][3]>>(8*i))&255)
            Bm[4*q+i][g]=e4m3((B[lane][0]>>(8*i))&255); Bm[16+4*q+i][g]=e4m3((B[lane][1]>>(8*i))&255)
    out=[]
    for lane in range(32):
        g,q=lane>>2,lane&3
        res=[]
        for e,(m,n) in enumerate([(g,2*q),(g,2*q+1),(g+8,2*q),(g+8,2*q+1)]):
            res.append(d[lane][e]+sum(Am[m][k]*Bm[k][n] for k in range(32)))
        out.append(res)
    return out

def run(fp4,MT,NT,U,N,K,T,W,WS,scale_cols,row0,XQ,ldq,XS,lds):
    P=4; nchunk=(K+127)//128; wstride=K//2 if fp4 else K
    Y={}
    for bx in range((N+16*MT-1)//(16*MT)):
      for by in range((T+8*NT-1)//(8*NT)):
        rb,tb=bx*16*MT,by*8*NT
        accs=[]
        for part in range(P):
          acc=[[[[0.0]*4 for _ in range(NT)] for _ in range(MT)] for _ in range(32)]
          c0=part
          while c0<nchunk:
            for u in range(U):
              c=c0+u*P
              if c>=nchunk: break
              if not fp4:
                A=[[[None,None] for _ in range(MT)] for _ in range(32)]  # per lane: mi -> h -> 8 words
                Bw=[[None]*NT for _ in range(32)]; sw=[[[0,0] for _ in range(MT)] for _ in range(32)]; sx=[[[0,0] for _ in range(NT)] for _ in range(32)]
                for lane in range(32):
                  g,q=lane>>2,lane&3
                  for mi in range(MT):
                    for h in range(2):
                      r=rb+16*mi+g+8*h
                      if r<N:
                        base=r*wstride+128*c+32*q
                        A[lane][mi][h]=[word(W,base+4*k) for k in range(8)]
                        sw[lane][mi][h]=2.0**(WS[((row0+r)//128)*scale_cols+c]-127)
                      else: A[lane][mi][h]=[0]*8
                  for ni in range(NT):
                    n=tb+8*ni+g
                    Bw[lane][ni]=[word(XQ,n*ldq+128*c+32*q+4*k) for k in range(8)] if n<T else [0]*8
                    for e in range(2):
                      nc=tb+8*ni+2*q+e
                      sx[lane][ni][e]=XS[nc*lds+c] if nc<T else 0
                for mi in range(MT):
                  for ni in range(NT):
                    f=[[0.0]*4 for _ in range(32)]
                    for j in range(4):
                      Ar=[[A[l][mi][0][2*j],A[l][mi][1][2*j],A[l][mi][0][2*j+1],A[l][mi][1][2*j+1]] for l in range(32)]
                      Br=[[Bw[l][ni][2*j],Bw[l][ni][2*j+1]] for l in range(32)]
                      f=mma(f,Ar,Br)
                    for l in range(32):
                      for e in range(4):
                        acc[l][mi][ni][e]+=f[l][e]*sw[l][mi][e>>1]*sx[l][ni][e&1]
              else:
                nb=min(4,(K-128*c)//32)
                for mi in range(MT):
                  for j in range(nb):
                    Ar=[];swl=[]
                    for lane in range(32):
                      g,q=lane>>2,lane&3
                      ws=[];s=[]
                      for h in range(2):
                        r=rb+16*mi+g+8*h
                        if r<N:
                          ws.append(word(W,r*wstride+64*c+16*j+4*q)); s.append(2.0**(WS[(row0+r)*scale_cols+4*c+j]-127))
                        else: ws.append(0); s.append(0)
                      Ar.append([cvt4(ws[0]),cvt4(ws[1]),cvt4(ws[0]>>16),cvt4(ws[1]>>16)]); swl.append(s)
                    for ni in range(NT):
                      Br=[]; sxl=[]
                      for lane in range(32):
                        g,q=lane>>2,lane&3
                        n=tb+8*ni+g
                        if n<T:
                          off=n*ldq+128*c+32*j+8*q; Br.append([word(XQ,off),word(XQ,off+4)])
                        else: Br.append([0,0])
                        sxl.append([XS[(tb+8*ni+2*q+e)*lds+c] if tb+8*ni+2*q+e<T else 0 for e in range(2)])
                      f=mma([[0.0]*4 for _ in range(32)],Ar,Br)
                      for l in range(32):
                        for e in range(4):
                          acc[l][mi][ni][e]+=f[l][e]*swl[l][e>>1]*sxl[l][e&1]
            c0+=P*U
          accs.append(acc)
        for l in range(32):
          g,q=l>>2,l&3
          for mi in range(MT):
            for ni in range(NT):
              for e in range(4):
                r=rb+16*mi+g+8*(e>>1); n=tb+8*ni+2*q+(e&1)
                if r<N and n<T: Y[(n,r)]=sum(accs[p][l][mi][ni][e] for p in range(4))
    return Y

def test(fp4,N,K,T,row0_view=0):
    random.seed(fp4*100+N+K+T)
    Nall=N+row0_view
    scale_cols=K//32 if fp4 else K//128
    if fp4:
        W=bytearray(Nall*K//2); codes={}
        for r in range(Nall):
            for i in range(K):
                c=random.choice([0,2,4,10,12,1,9,3,11]); codes[(r,i)]=c
                W[r*K//2+i//2]|= (c<<4) if i&1 else c
        WS=bytes(random.choice([125,126,127]) for _ in range(Nall*scale_cols))
        wv=lambda r,i: e2m1(codes[(r,i)])*2.0**(WS[r*scale_cols+i//32]-127)
    else:
        W=bytes(random.choice([0,0x38,0x40,0xb8,0xc0,0x30,0xb0,0x3c]) for _ in range(Nall*K))
        WS=bytes(random.choice([125,126,127]) for _ in range(((Nall+127)//128)*scale_cols))
        wv=lambda r,i: e4m3(W[r*K+i])*2.0**(WS[(r//128)*scale_cols+i//128]-127)
    ldq=(K+15)//16*16; lds=(K+127)//128
    XQ=bytes(random.choice([0,0x38,0x40,0xb8,0xc0,0x48,0xc8]) for _ in range(T*ldq))
    XS=[2.0**random.randint(-3,3) for _ in range(T*lds)]
    ok=True
    for (MT,NT,U) in [(1,1,4),(1,4,2),(2,4,1),(4,4,1)]:
        Wv=W[row0_view*(K//2 if fp4 else K):]
        Y=run(fp4,MT,NT,U,N,K,T,Wv,WS,scale_cols,row0_view,XQ,ldq,XS,lds)
        for n in range(T):
            for r in range(N):
                ref=sum(wv(r+row0_view,i)*e4m3(XQ[n*ldq+i])*XS[n*lds+i//128] for i in range(K))
                if Y[(n,r)]!=ref: print("MISMATCH",fp4,MT,NT,U,n,r,Y[(n,r)],ref); ok=False; break
            if not ok: break
    print("fp4" if fp4 else "fp8",N,K,T,"row0",row0_view,"ok" if ok else "FAIL")
    return ok
import sys
results=[test(0,20,256,11), test(1,20,160,11), test(0,18,640,3,row0_view=120), test(1,17,608,9,row0_view=5)]
sys.exit(0 if all(results) else 1)
