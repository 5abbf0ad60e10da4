//! Tensor descriptors going in (borrowed from the caller) and views coming
//! out (library-owned memory, borrowed from the handle).
use crate::error::{Error, Result, Status};
use moe_ep_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;

/// A DLPack dtype (code, bits, lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

impl DType {
    pub const BF16: DType = DType::new(sys::MOE_EP_DTYPE_BFLOAT, 16);
    pub const F16: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT, 16);
    pub const F32: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT, 32);
    pub const F64: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT, 64);
    pub const FP8_E4M3FN: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
    pub const FP8_E5M2: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT8_E5M2, 8);
    pub const FP4_E2M1FN: DType = DType::new(sys::MOE_EP_DTYPE_FLOAT4_E2M1FN, 4);
    pub const I8: DType = DType::new(sys::MOE_EP_DTYPE_INT, 8);
    pub const I32: DType = DType::new(sys::MOE_EP_DTYPE_INT, 32);
    pub const I64: DType = DType::new(sys::MOE_EP_DTYPE_INT, 64);
    pub const U8: DType = DType::new(sys::MOE_EP_DTYPE_UINT, 8);
    pub const U16: DType = DType::new(sys::MOE_EP_DTYPE_UINT, 16);

    pub const fn new(code: u8, bits: u8) -> DType {
        DType { code, bits, lanes: 1 }
    }
    pub(crate) fn raw(self) -> sys::moe_ep_dtype_t {
        sys::moe_ep_dtype_t { code: self.code, bits: self.bits, lanes: self.lanes }
    }
    pub(crate) fn from_raw(d: sys::moe_ep_dtype_t) -> DType {
        DType { code: d.code, bits: d.bits, lanes: d.lanes }
    }
}

/// A Rust element type with its natural dtype.  bf16/fp16/fp8 data are held
/// as u16/u8 and retagged with `TensorRef::with_dtype`.
pub trait Element: Copy + 'static {
    const DTYPE: DType;
}
impl Element for f32 { const DTYPE: DType = DType::F32; }
impl Element for f64 { const DTYPE: DType = DType::F64; }
impl Element for i8 { const DTYPE: DType = DType::I8; }
impl Element for i32 { const DTYPE: DType = DType::I32; }
impl Element for i64 { const DTYPE: DType = DType::I64; }
impl Element for u8 { const DTYPE: DType = DType::U8; }
impl Element for u16 { const DTYPE: DType = DType::U16; }

/// DLPack device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    pub device_type: i32,
    pub device_id: i32,
}

impl Device {
    pub const CPU: Device = Device { device_type: sys::MOE_EP_DEVICE_CPU, device_id: 0 };
    pub const fn cuda(id: i32) -> Device {
        Device { device_type: sys::MOE_EP_DEVICE_CUDA, device_id: id }
    }
    fn is_host(self) -> bool {
        self.device_type == sys::MOE_EP_DEVICE_CPU || self.device_type == sys::MOE_EP_DEVICE_CUDA_HOST
    }
}

const MAX_NDIM: usize = 4;

fn shape_array(shape: &[i64]) -> Result<[i64; MAX_NDIM]> {
    if shape.len() > MAX_NDIM || shape.iter().any(|&d| d < 0) {
        return Err(Error::new(Status::INVALID_ARGUMENT,
                              format!("shape {shape:?}: expected at most {MAX_NDIM} non-negative extents")));
    }
    let mut a = [0i64; MAX_NDIM];
    a[..shape.len()].copy_from_slice(shape);
    Ok(a)
}

fn check_len(len: usize, shape: &[i64]) -> Result<()> {
    let n: i64 = shape.iter().product();
    if n as usize != len {
        return Err(Error::new(Status::INVALID_ARGUMENT,
                              format!("shape {shape:?} holds {n} elements, the slice {len}")));
    }
    Ok(())
}

/// A read-only compact row-major tensor borrowed for `'a`.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    data: *mut c_void,
    device: Device,
    dtype: DType,
    ndim: usize,
    shape: [i64; MAX_NDIM],
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> TensorRef<'a> {
    /// A host tensor over `data` with `shape` (whose product must be data.len()).
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[i64]) -> Result<Self> {
        check_len(data.len(), shape)?;
        Ok(TensorRef {
            data: data.as_ptr() as *mut c_void,
            device: Device::CPU,
            dtype: T::DTYPE,
            ndim: shape.len(),
            shape: shape_array(shape)?,
            _borrow: PhantomData,
        })
    }

    /// A tensor over memory this crate cannot see (e.g. a CUDA allocation).
    ///
    /// # Safety
    /// `data` must point to a compact row-major tensor of `shape` and `dtype`
    /// on `device`, valid for reads for `'a` and until the stream work that
    /// uses it has finished.
    pub unsafe fn from_raw(data: *const c_void, device: Device, dtype: DType, shape: &[i64]) -> Result<Self> {
        Ok(TensorRef {
            data: data as *mut c_void,
            device,
            dtype,
            ndim: shape.len(),
            shape: shape_array(shape)?,
            _borrow: PhantomData,
        })
    }

    /// The same bytes tagged with another dtype of the same width (u16 -> bf16).
    pub fn with_dtype(mut self, dtype: DType) -> Result<Self> {
        if dtype.bits as u32 * dtype.lanes as u32 != self.dtype.bits as u32 * self.dtype.lanes as u32 {
            return Err(Error::new(Status::INVALID_ARGUMENT,
                                  format!("with_dtype: {dtype:?} is not as wide as {:?}", self.dtype)));
        }
        self.dtype = dtype;
        Ok(self)
    }

    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.ndim]
    }

    /// The C descriptor; its shape points into `self`, so `self` must stay
    /// where it is while the descriptor is in use.
    pub(crate) fn raw(&self) -> sys::moe_ep_tensor_t {
        sys::moe_ep_tensor_t {
            data: self.data,
            device: sys::moe_ep_device_t { device_type: self.device.device_type, device_id: self.device.device_id },
            ndim: self.ndim as i32,
            dtype: self.dtype.raw(),
            shape: self.shape.as_ptr() as *mut i64,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

/// A writable tensor borrowed for `'a` (combine's caller-provided output).
#[derive(Debug)]
pub struct TensorMut<'a> {
    inner: TensorRef<'a>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> TensorMut<'a> {
    pub fn from_slice<T: Element>(data: &'a mut [T], shape: &[i64]) -> Result<Self> {
        check_len(data.len(), shape)?;
        Ok(TensorMut {
            inner: TensorRef {
                data: data.as_mut_ptr() as *mut c_void,
                device: Device::CPU,
                dtype: T::DTYPE,
                ndim: shape.len(),
                shape: shape_array(shape)?,
                _borrow: PhantomData,
            },
            _borrow: PhantomData,
        })
    }

    /// # Safety
    /// As `TensorRef::from_raw`, and valid for writes.
    pub unsafe fn from_raw(data: *mut c_void, device: Device, dtype: DType, shape: &[i64]) -> Result<Self> {
        Ok(TensorMut { inner: unsafe { TensorRef::from_raw(data, device, dtype, shape)? }, _borrow: PhantomData })
    }

    pub fn with_dtype(self, dtype: DType) -> Result<Self> {
        Ok(TensorMut { inner: self.inner.with_dtype(dtype)?, _borrow: PhantomData })
    }

    pub(crate) fn raw(&self) -> sys::moe_ep_tensor_t {
        self.inner.raw()
    }
}

/// A result tensor in library-owned memory.  It borrows the handle, so the
/// borrow checker ends its life before the next dispatch, combine or destroy
/// (the points where the library may reuse the memory).
#[derive(Debug)]
pub struct View<'h> {
    data: *mut c_void,
    device: Device,
    dtype: DType,
    shape: Vec<i64>,
    _handle: PhantomData<&'h mut ()>,
}

impl<'h> View<'h> {
    /// None for an absent result (data NULL and ndim 0).
    pub(crate) fn from_raw(t: &sys::moe_ep_tensor_t) -> Option<View<'h>> {
        if t.data.is_null() && t.ndim == 0 {
            return None;
        }
        // Copy the shape: the handle's shape arrays are rewritten by later calls.
        let shape = (0..t.ndim as usize).map(|i| unsafe { *t.shape.add(i) }).collect();
        Some(View {
            data: unsafe { (t.data as *mut u8).add(t.byte_offset as usize) } as *mut c_void,
            device: Device { device_type: t.device.device_type, device_id: t.device.device_id },
            dtype: DType::from_raw(t.dtype),
            shape,
            _handle: PhantomData,
        })
    }

    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> Device {
        self.device
    }
    /// Raw address (device memory for the CUDA backend).
    pub fn data_ptr(&self) -> *mut c_void {
        self.data
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    /// The elements, writable, for host views of dtype `T::DTYPE` (for
    /// `DispatchResult::combine_input`, the one view meant to be written).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let n = self.as_slice::<T>()?.len();
        if n == 0 {
            return Ok(&mut []);
        }
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data as *mut T, n) })
    }

    /// The raw bits of a host view whose elements are as wide as `T` (u8 for
    /// an FP8 view, u16 for BF16 or F16), whatever its dtype code.
    pub fn as_bits<T: Element>(&self) -> Result<&[T]> {
        if self.dtype.lanes != 1 || self.dtype.bits != T::DTYPE.bits {
            return Err(Error::new(Status::INVALID_ARGUMENT,
                                  format!("as_bits: the view holds {:?}, elements of {} bits, asked for {:?}",
                                          self.dtype, self.dtype.bits as u32 * self.dtype.lanes as u32, T::DTYPE)));
        }
        self.host_slice()
    }

    /// The elements, for host views of dtype `T::DTYPE`.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if !self.device.is_host() {
            return Err(Error::new(Status::INVALID_ARGUMENT,
                                  format!("as_slice: the view lives on {:?}, not in host memory", self.device)));
        }
        if T::DTYPE != self.dtype {
            return Err(Error::new(Status::INVALID_ARGUMENT,
                                  format!("as_slice: the view holds {:?}, asked for {:?}", self.dtype, T::DTYPE)));
        }
        self.host_slice()
    }

    fn host_slice<T: Element>(&self) -> Result<&[T]> {
        if !self.device.is_host() {
            return Err(Error::new(Status::INVALID_ARGUMENT,
                                  format!("the view lives on {:?}, not in host memory", self.device)));
        }
        let n = self.numel();
        if n == 0 {
            return Ok(&[]);
        }
        Ok(unsafe { std::slice::from_raw_parts(self.data as *const T, n) })
    }
}
